"""RowIndex: meta-device IDs to table rows in bulk, by hash, with an exact path."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from plugin.placement.row_index import RowIndex
from tests.conftest import REPO_ROOT

IDS = [
    f"GPU-{gpu:08x}-aaaa-bbbb-cccc-dddddddddddd::{unit}" for gpu in range(4) for unit in range(50)
]


def colliding(value: str) -> int:
    """A hasher under which every ID of one length collides: forces the exact path."""
    return len(value)


@pytest.fixture(params=["by-hash", "exact"])
def index(request: pytest.FixtureRequest) -> RowIndex:
    built = RowIndex(IDS) if request.param == "by-hash" else RowIndex(IDS, hasher=colliding)
    assert built.by_hash is (request.param == "by-hash")
    return built


def test_rows_in_the_order_asked_with_duplicates_repeated(index: RowIndex) -> None:
    asked = [IDS[199], IDS[0], IDS[57], IDS[0], IDS[120]]
    assert index.of(asked).tolist() == [199, 0, 57, 0, 120]


def test_rows_of_every_id_and_of_none(index: RowIndex) -> None:
    assert index.of(list(reversed(IDS))).tolist() == list(reversed(range(len(IDS))))
    assert index.of([]).tolist() == []


@pytest.mark.parametrize(
    "unknown",
    [
        pytest.param("GPU-00000009-aaaa-bbbb-cccc-dddddddddddd::3", id="other-gpu"),
        pytest.param(IDS[3] + "x", id="a-known-id-extended"),
        pytest.param(IDS[3][:-1], id="a-known-id-cut"),
        pytest.param("", id="empty"),
        pytest.param("z" * 300, id="long"),
    ],
)
def test_the_first_unknown_id_is_named(index: RowIndex, unknown: str) -> None:
    with pytest.raises(KeyError) as caught:
        index.of([IDS[5], unknown, "also-unknown", IDS[6]])
    assert caught.value.args == (unknown,)


def test_a_table_whose_ids_share_a_hash_is_looked_up_exactly() -> None:
    # Two IDs of the same length collide under ``colliding``; the rest do not.
    ids = ["a::1", "b::2", "cc::3"]
    index = RowIndex(ids, hasher=colliding)
    assert not index.by_hash
    assert index.of(["b::2", "a::1", "cc::3"]).tolist() == [1, 0, 2]


def test_an_empty_table_knows_no_id() -> None:
    index = RowIndex([])
    assert index.of([]).tolist() == []
    with pytest.raises(KeyError) as caught:
        index.of(["GPU-x::0"])
    assert caught.value.args == ("GPU-x::0",)


def test_duplicate_ids_in_the_table_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        RowIndex(["a::0", "a::0"])


def test_an_index_unpickled_in_another_process_still_answers_right(tmp_path: Path) -> None:
    """``hash()`` of a str differs between processes: an index built in one
    and sent to another (as multiprocessing does) holds hashes nothing there
    matches, so it must answer on the exact path, rows and errors alike."""
    pickled = tmp_path / "index.pickle"
    pickled.write_bytes(pickle.dumps(RowIndex(IDS)))
    script = (
        "import pickle, sys\n"
        f"index = pickle.loads(open({str(pickled)!r}, 'rb').read())\n"
        f"ids = {IDS!r}\n"
        "rows = index.of([ids[150], ids[2], ids[75]]).tolist()\n"
        "assert rows == [150, 2, 75], rows\n"
        "try:\n"
        "    index.of([ids[1], 'GPU-unknown::0'])\n"
        "except KeyError as exc:\n"
        "    assert exc.args == ('GPU-unknown::0',), exc.args\n"
        "else:\n"
        "    raise AssertionError('unknown ID accepted')\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    if os.environ.get("PYTHONHASHSEED") == "12345":
        env["PYTHONHASHSEED"] = "54321"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
