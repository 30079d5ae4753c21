"""The JSON choice files under TL_CACHE_DIR (runtime/json_cache.py)."""

from __future__ import annotations

import threading

from tensorlogic.runtime import json_cache


def test_json_cache_writes_from_many_threads_leave_whole_files(tmp_path):
    path = tmp_path / "choices.json"
    docs = [{"k": "x" * (5000 + i)} for i in range(8)]
    threads = [threading.Thread(target=json_cache.write, args=(path, d)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json_cache.read(path) in docs  # one writer's whole document, not a mixture
    assert [p.name for p in tmp_path.iterdir()] == ["choices.json"]  # no temporary left


def test_unreadable_and_unwritable_files_are_no_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert json_cache.read(bad) is None and json_cache.read_entries(bad) == {}
    json_cache.store_entry(bad, "a", 1)
    json_cache.store_entry(bad, "b", 2)  # read again before writing: "a" is kept
    assert json_cache.read_entries(bad) == {"a": 1, "b": 2}
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    json_cache.write(blocked / "sub" / "x.json", {"a": 1})  # its folder cannot exist: ignored
    assert json_cache.read(blocked / "sub" / "x.json") is None
