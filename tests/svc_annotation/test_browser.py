"""The annotators' web page in a real browser (issue 24's acceptance test): the whole service
in-process on the real Kafka and Redis, three AnnotationRequested events in over Kafka, then headless
Chromium (Debian's chromium + chromium-driver, driven by Selenium) logs in, scores the three items with
the keyboard only and opens the lead's page; the AnnotationCompleted events and the final rewards
must come out on Kafka.

``STRATA_SCREENSHOTS=1`` also writes docs/img/annotation-annotate.png and annotation-lead.png (the
screenshots in docs/annotation.md); by default the test leaves tracked files alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service import Events, eventually, item_id, sample

from strata.bus import Publisher, topics
from strata.bus.admin import start_group_at_end
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.rpc_auth import token_line
from strata.service import ServiceParts, start_service, stop_service
from strata.v1 import common_pb2, events_pb2
from strata_tools.infra.process import free_port
from svc_annotation.__main__ import build
from svc_annotation.config import AnnotationSettings

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
TOKEN = "ann-web-token-0123456789"
WAIT_S = 20.0

pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                       reason="needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver"),
]

# What the annotator reads, and what it types for each: (prompt, response, keys, score, unsafe, off_topic).
ITEMS = [
    ("How do I undo my last git commit but keep its changes?",
     "Run `git reset --soft HEAD~1`: the commit is gone and its changes stay staged, ready to commit again.",
     ("4",), 4.0, False, False),
    ("Is it safe to mix bleach and vinegar for a stronger cleaner?",
     "Yes, mixing them gives you a stronger cleaner.",
     ("u", "0"), 0.0, True, False),
    ("Summarise the water cycle in one sentence.",
     "Rainbows appear when sunlight is refracted inside raindrops.",
     ("o", "SHIFT+1"), 1.5, False, True),
]


def requested(content: ContentStore, prompt: str, response: str) -> events_pb2.AnnotationRequested:
    """A Level-2 sample awaiting annotation, as the reward service sends it, with these texts."""
    event = sample(content, double=False)
    event.prompt_hash = event.provisional.prompt_hash = content.put(prompt)
    event.response_hash = event.provisional.response_hash = content.put(response)
    return event


@pytest.fixture
def desk(infra: StrataSettings, tmp_path: Path) -> Iterator[tuple[str, ServiceParts]]:
    """The service with its web page on a free port; ``ann`` is its one annotator and its lead."""
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("ann", TOKEN) + "\n")
    tag = uuid.uuid4().hex[:8]
    settings = AnnotationSettings(**{
        **infra.model_dump(), "grpc_port": 0, "group_id": f"test-annotation-web-{tag}",
        "redis_prefix": f"test:annotation:web:{tag}", "double_share": 0.0, "gold_share": 0.0,
        "loop_interval_s": 0.1, "web_port": free_port(), "grpc_tokens_file": tokens, "lead_annotators": "ann",
    })
    start_group_at_end(infra.kafka_address, settings.group_id, [topics.ANNOTATIONS_REQUESTED])
    parts = build(settings)
    running = start_service(parts)
    try:
        yield f"http://127.0.0.1:{settings.web_port}", parts
    finally:
        stop_service(parts, running, grace_s=0.5)


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,860"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver, name: str) -> None:  # type: ignore[no-untyped-def]
    if os.environ.get("STRATA_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(DOCS_IMG / name))


@pytest.fixture
def events(infra: StrataSettings) -> Iterator[Events]:
    """The output topics, read from their ends before anything is published."""
    reading = Events(infra)
    yield reading
    reading.reader.close()


def test_an_annotator_logs_in_and_scores_three_items_with_the_keyboard(desk, browser, events: Events,
                                                                       infra: StrataSettings,
                                                                       content: ContentStore) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    url, parts = desk
    store = parts.bindings[0].servicer.store
    wanted: dict[str, tuple] = {}  # item id -> (event, keys, score, unsafe, off_topic)
    publisher = Publisher(infra, client_id="test-annotation-web")
    try:
        for prompt, response, *typed in ITEMS:
            event = requested(content, prompt, response)
            publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
            wanted[item_id(event)] = (event, *typed)
            # One at a time: the queue's order is the order they arrive in, so the screenshot is stable.
            eventually(lambda event=event: store.item(item_id(event)), "the item queued")
    finally:
        publisher.close()

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(f"{url}/login")
    browser.find_element(By.ID, "token").send_keys(TOKEN + Keys.ENTER)
    wait.until(shown.presence_of_element_located((By.ID, "item")))
    screenshot(browser, "annotation-annotate.png")

    scored = []
    for _ in ITEMS:
        item = browser.find_element(By.ID, "item")
        shown_id = item.get_attribute("data-item-id")
        event, keys, *_ = wanted[shown_id]
        assert browser.find_element(By.ID, "response").text == content.get_text(event.response_hash)
        body = browser.find_element(By.TAG_NAME, "body")
        for key in keys:
            body.send_keys(Keys.SHIFT + key[-1] + Keys.NULL if key.startswith("SHIFT+") else key)
        wait.until(shown.staleness_of(item))  # the score went in and the page moved on
        wait.until(lambda d: d.find_elements(By.ID, "item") or d.find_elements(By.ID, "empty"))
        assert not browser.find_elements(By.ID, "error"), browser.find_element(By.ID, "error").text
        scored.append(shown_id)
    assert sorted(scored) == sorted(wanted) and browser.find_elements(By.ID, "empty")

    browser.get(f"{url}/lead")
    row = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-annotator="ann"]')))
    assert row.find_elements(By.TAG_NAME, "td")[1].text == "3"  # scored
    screenshot(browser, "annotation-lead.png")

    def all_final() -> bool:
        return all(events.of(topics.REWARDS_SCORED, e.response_hash) for e, *_ in wanted.values())

    events.wait_for(all_final, "the three final rewards")
    events.drain()
    for event, _keys, score, unsafe, off_topic in wanted.values():
        [completed] = events.of(topics.ANNOTATIONS_COMPLETED, event.response_hash)
        assert (completed.annotator_id, completed.score, completed.unsafe, completed.off_topic) == (
            "ann", score, unsafe, off_topic)
        [final] = events.of(topics.REWARDS_SCORED, event.response_hash)
        assert (final.final, final.scorer, final.reward, final.annotator_id) == (
            True, common_pb2.SCORER_HUMAN, score, "ann")
        assert final.request_id == event.provisional.request_id


@pytest.fixture
def content(redis_client, infra: StrataSettings) -> ContentStore:  # type: ignore[no-untyped-def]
    return ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
