"""Content store against the real Redis."""

import uuid

import pytest
import redis

from strata.config import StrataSettings
from strata.content_store import ContentNotFoundError, ContentStore, ContentTooLargeError, StoreUnavailableError
from strata.hashing import InvalidTextError, content_hash
from strata_tools.infra.process import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_client: redis.Redis) -> ContentStore:
    return ContentStore(redis_client, ttl_s=3600, max_bytes=1024)


def test_text_and_tokens_round_trip(store: ContentStore) -> None:
    text = f"Explain the principle of recursion. {uuid.uuid4()} café"
    tokens = [0, 1, 50256, 2**32 - 1]
    digest = store.put(text, tokens, tokenizer_id="zoo-bpe")
    assert digest == content_hash(text)
    assert store.get_text(digest) == text
    assert store.get_tokens(digest, "zoo-bpe") == tokens
    assert store.contains(digest)


def test_a_batch_of_texts_comes_back_in_order_or_names_the_missing_one(store: ContentStore) -> None:
    texts = [f"prompt {i} {uuid.uuid4()}" for i in range(3)]
    digests = [store.put(t) for t in texts]
    assert store.get_texts([digests[2], digests[0], digests[2]]) == [texts[2], texts[0], texts[2]]
    assert store.get_texts([]) == []
    missing = content_hash(f"never stored {uuid.uuid4()}")
    with pytest.raises(ContentNotFoundError, match=missing):
        store.get_texts([digests[1], missing])


def test_put_is_idempotent(store: ContentStore) -> None:
    text = f"same {uuid.uuid4()}"
    assert store.put(text) == store.put(text)
    assert store.get_text(content_hash(text)) == text


def test_decomposed_text_lands_under_the_nfc_hash(store: ContentStore) -> None:
    suffix = uuid.uuid4().hex
    digest = store.put("cafe\u0301 " + suffix)
    assert digest == content_hash("caf\u00e9 " + suffix)
    assert store.get_text(digest) == "caf\u00e9 " + suffix


def test_items_expire(store: ContentStore, redis_client: redis.Redis) -> None:
    digest = store.put(f"ttl {uuid.uuid4()}", [1, 2])
    assert 0 < redis_client.ttl(f"strata:content:text:{digest}") <= 3600
    assert 0 < redis_client.ttl(f"strata:content:tokens:default:{digest}") <= 3600


def test_oversize_text_is_refused_and_nothing_is_written(store: ContentStore) -> None:
    text = "x" * 1025 + uuid.uuid4().hex
    expected = r"text is 1057 bytes, over .* limit of 1024 bytes .*STRATA_CONTENT_MAX_BYTES"
    with pytest.raises(ContentTooLargeError, match=expected):
        store.put(text)
    assert not store.contains(content_hash(text))


def test_oversize_tokens_leave_no_half_item(store: ContentStore) -> None:
    text = f"fits {uuid.uuid4()}"
    with pytest.raises(ContentTooLargeError, match="token ids"):
        store.put(text, list(range(300)))  # 1200 bytes as uint32
    assert not store.contains(content_hash(text))


def test_bad_token_ids_are_refused(store: ContentStore) -> None:
    with pytest.raises(ValueError, match="token ids"):
        store.put(f"neg {uuid.uuid4()}", [1, -1])


def test_invalid_text_is_refused(store: ContentStore) -> None:
    with pytest.raises(InvalidTextError):
        store.put("broken \udc80")


def test_missing_items_raise_clearly(store: ContentStore) -> None:
    digest = content_hash(f"never stored {uuid.uuid4()}")
    with pytest.raises(ContentNotFoundError, match=f"no text under hash {digest}"):
        store.get_text(digest)
    with pytest.raises(ContentNotFoundError, match="for tokenizer 'zoo-bpe'"):
        store.get_tokens(digest, "zoo-bpe")


def test_redis_down_is_a_clear_unavailable_error(infra: StrataSettings) -> None:
    store = ContentStore.from_url(f"redis://127.0.0.1:{free_port()}/0", ttl_s=60, max_bytes=1024)
    with pytest.raises(StoreUnavailableError, match=r"content store \(Redis\) unavailable"):
        store.put("hello")
