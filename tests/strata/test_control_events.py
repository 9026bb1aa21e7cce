"""Control events are checked before a follower acts on them: confined paths, checksums required,
a policy version that matches the checkpoint's own (strata.contract.control, the watchers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata.contract.checksums import POLICY_META_FILE, POLICY_WEIGHTS_FILE, policy_checksum
from strata.contract.control import ControlEventError, check_rm_update, confined_path
from strata.v1 import events_pb2
from svc_generator.policy_watch import PolicyWatcher


def checkpoint(root: Path, version: int) -> Path:
    directory = root / f"v{version}"
    directory.mkdir(parents=True)
    (directory / POLICY_WEIGHTS_FILE).write_bytes(f"weights of v{version}".encode())
    (directory / POLICY_META_FILE).write_text(json.dumps({"version": version, "step": version}))
    return directory


class RecordingBatcher:
    def __init__(self) -> None:
        self.requested: list[tuple[str, int]] = []

    def request_weights(self, path: str, version: int) -> None:
        self.requested.append((path, version))

    def reset_version_floor(self) -> None:
        pass


def update(directory: Path | str, version: int, checksum: str | None = None) -> events_pb2.PolicyUpdated:
    return events_pb2.PolicyUpdated(policy_version=version, checkpoint_path=str(directory), lineage="run-1",
                                    checksum=checksum if checksum is not None else policy_checksum(directory))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def test_a_verified_update_inside_the_root_is_handed_to_the_batcher(root: Path) -> None:
    batcher = RecordingBatcher()
    watcher = PolicyWatcher("unused:9092", batcher, checkpoint_root=root)  # type: ignore[arg-type]
    v3 = checkpoint(root, 3)
    assert watcher.apply(update(v3, 3))
    assert batcher.requested == [(str(v3), 3)]


def test_bad_policy_updates_are_refused_and_a_later_real_one_still_loads(root: Path, tmp_path: Path) -> None:
    batcher = RecordingBatcher()
    watcher = PolicyWatcher("unused:9092", batcher, checkpoint_root=root)  # type: ignore[arg-type]
    v1, v2 = checkpoint(root, 1), checkpoint(root, 2)
    foreign = checkpoint(tmp_path / "elsewhere", 5)
    bad = [
        update(v1, 2**63 - 1, policy_checksum(v1)),    # a huge version no real update could beat
        update(foreign, 5),                            # foreign weights outside the root
        update(root / ".." / "elsewhere" / "v5", 5),   # the same through ..
        update(f"{v1}\x00/etc", 1, policy_checksum(v1)),  # a NUL byte
        update(v1, 1, ""),                             # no checksum
        update(v1, 1, "0" * 64),                       # a checksum of other files
        update(root / "v9", 9, "a" * 64),              # a checkpoint that is not there
    ]
    assert [watcher.apply(event) for event in bad] == [False] * len(bad)
    assert watcher.rejected == 6  # the wrong checksum is refused after reading the files
    assert batcher.requested == []
    assert watcher.apply(update(v2, 2))  # the follower is not frozen: the real next version loads
    assert batcher.requested == [(str(v2), 2)]


def test_rm_updates_need_a_checksum_and_paths_in_the_root(tmp_path: Path) -> None:
    root = tmp_path / "rms"
    (root / "light-1").mkdir(parents=True)
    assert check_rm_update("light-1", [str(root / "light-1")], "a" * 64, root) == [(root / "light-1").resolve()]
    for version, paths, checksum, words in [
        ("light-1", [str(root / "light-1")], "", "checksum"),
        ("light-1", ["/etc"], "a" * 64, "outside"),
        ("", [str(root / "light-1")], "a" * 64, "rm_version"),
        ("x" * 500, [str(root / "light-1")], "a" * 64, "rm_version"),
        ("light-1", [], "a" * 64, "no model path"),
    ]:
        with pytest.raises(ControlEventError, match=words):
            check_rm_update(version, paths, checksum, root)


def test_without_a_root_any_absolute_path_is_allowed_but_nul_never(tmp_path: Path) -> None:
    assert confined_path(str(tmp_path), None) == tmp_path.resolve()
    with pytest.raises(ControlEventError, match="control characters"):
        confined_path("/tmp/a\x00b", None)
