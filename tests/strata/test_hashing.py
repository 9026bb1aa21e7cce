import hashlib

import pytest

from strata.hashing import InvalidTextError, content_hash, decode_utf8, is_content_hash, normalise


def test_hash_is_sha256_of_utf8() -> None:
    assert content_hash("hello") == hashlib.sha256(b"hello").hexdigest()
    assert content_hash("héllo") == hashlib.sha256("héllo".encode()).hexdigest()


def test_nfc_makes_composed_and_decomposed_accents_equal() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert composed != decomposed
    assert content_hash(composed) == content_hash(decomposed)
    assert normalise(decomposed) == composed


@pytest.mark.parametrize(("a", "b"), [("Explain X", "explain X"), ("Explain X", "Explain X "), ("a\nb", "a b")])
def test_no_normalisation_beyond_nfc(a: str, b: str) -> None:
    assert content_hash(a) != content_hash(b)


def test_nfkc_compatibility_forms_are_not_folded() -> None:
    # NFC keeps the ligature "ﬁ"; NFKC would turn it into "fi". We promise NFC only.
    assert content_hash("\ufb01") != content_hash("fi")


def test_lone_surrogate_is_rejected_clearly() -> None:
    with pytest.raises(InvalidTextError, match="not valid Unicode"):
        content_hash("bad \ud800 text")


def test_non_str_is_rejected() -> None:
    with pytest.raises(InvalidTextError, match="expected str"):
        content_hash(b"bytes")  # type: ignore[arg-type]


def test_decode_utf8_names_the_field() -> None:
    assert decode_utf8("ok é".encode()) == "ok é"
    with pytest.raises(InvalidTextError, match="prompt is not valid UTF-8"):
        decode_utf8(b"\xff\xfe", field="prompt")


def test_is_content_hash() -> None:
    assert is_content_hash(content_hash("x"))
    assert not is_content_hash("abc")
    assert not is_content_hash(content_hash("x").upper())
