"""The in-memory dedupe index against a plain set: same answers, few runs, bounded size."""

from __future__ import annotations

import numpy as np

from tracedag.pipeline.store.dedupe import DedupeIndex


def test_index_answers_like_a_set_and_keeps_logarithmic_runs():
    rng = np.random.default_rng(7)
    index, seen = DedupeIndex(max_keys=10**9), set()
    for step in range(300):
        fresh = rng.integers(1, 2**62, size=int(rng.integers(1, 400)), dtype=np.int64).astype(np.uint64)
        old = np.array(sorted(seen)[: 5], dtype=np.uint64) if step % 7 == 0 and seen else np.zeros(0, np.uint64)
        keys = np.concatenate([fresh, old])
        res = index.check(keys, keys + np.uint64(1))
        assert res.keep.tolist() == [k not in seen and k not in keys[:i].tolist()
                                     for i, k in enumerate(keys.tolist())]
        index.add("2026-11-30-06", keys[res.keep], keys[res.keep] + np.uint64(1))
        seen.update(keys.tolist())
        runs = index._runs["2026-11-30-06"]
        assert all(np.all(k[:-1] <= k[1:]) for k, _ in runs)  # every run sorted
        assert len(runs) <= 2 * int(np.log2(len(seen))) + 2
    assert len(index) == len(seen)


def test_conflicting_content_is_counted_once_per_row():
    index = DedupeIndex()
    keys = np.array([5, 9, 11], dtype=np.uint64)
    index.add("2026-11-30-06", keys, np.array([50, 90, 110], dtype=np.uint64))
    for _ in range(20):  # many more runs, merged as they come
        index.add("2026-11-30-06", np.array([np.uint64(1000 + len(index))]), np.array([np.uint64(1)]))
    res = index.check(np.array([9, 11, 12], dtype=np.uint64), np.array([90, 111, 7], dtype=np.uint64))
    assert res.keep.tolist() == [False, False, True]
    assert (res.duplicates, res.conflicts) == (2, 1)


def test_size_bound_forgets_oldest_runs_first():
    index = DedupeIndex(max_keys=1000)
    for h in range(5):
        index.add(f"2026-11-30-0{h}", np.arange(h * 400, h * 400 + 400, dtype=np.uint64) + np.uint64(1),
                  np.ones(400, np.uint64))
    assert len(index) <= 1000
    newest = np.arange(1601, 2001, dtype=np.uint64)
    assert not index.check(newest, np.ones(400, np.uint64)).keep.any()  # the newest hour is still known
    assert index.check(np.array([1], dtype=np.uint64), np.ones(1, np.uint64)).keep.all()  # the oldest forgotten


def test_merge_equals_a_stable_sort_of_both_runs():
    from tracedag.pipeline.store.dedupe import _merge

    rng = np.random.default_rng(3)
    for na, nb in [(0, 5), (5, 0), (0, 0), (1000, 1000), (10, 3), (3, 400)]:
        ka = np.sort(rng.integers(0, 50, na).astype(np.uint64))  # many equal keys across the runs
        kb = np.sort(rng.integers(0, 50, nb).astype(np.uint64))
        ca, cb = np.arange(na, dtype=np.uint32), np.arange(nb, dtype=np.uint32) + np.uint32(10**6)
        keys, content = _merge((ka, ca), (kb, cb))
        k, c = np.concatenate([ka, kb]), np.concatenate([ca, cb])
        order = np.argsort(k, kind="stable")
        assert keys.tolist() == k[order].tolist() and content.tolist() == c[order].tolist()


def test_runs_stop_growing_at_the_cap_and_the_oldest_are_forgotten_a_run_at_a_time():
    rng = np.random.default_rng(11)
    index, kept = DedupeIndex(max_keys=80_000), []
    assert index.run_cap == 65_536  # max_keys / 8 is below the floor
    index.run_cap = 10_000  # small enough to see many runs
    for _ in range(200):
        keys = rng.integers(1, 2**62, size=1000, dtype=np.int64).astype(np.uint64)
        index.add("2026-11-30-06", keys, keys)
        kept.append(keys)
    runs = index._runs["2026-11-30-06"]
    assert max(len(k) for k, _ in runs) <= 10_000 and len(runs) <= 8 + 2 * 14
    assert 80_000 - 10_000 <= len(index) <= 80_000  # beyond the bound, whole old runs go
    newest = np.concatenate(kept[-60:])
    assert not index.check(newest, newest).keep.any()
    assert index.check(kept[0], kept[0]).keep.all()


def test_a_reload_reads_only_the_newest_files_that_fit(tmp_path):
    import os

    from tracedag.pipeline.store.dedupe import write_sidecar

    root = tmp_path / "spans"
    files = []
    for h in range(6):  # six hours of 1000-key files, oldest first
        part = root / f"recv_hour=2026-11-30-0{h}"
        part.mkdir(parents=True)
        f = part / "seg.parquet"
        f.write_bytes(b"")
        keys = np.arange(h * 1000 + 1, h * 1000 + 1001, dtype=np.uint64)
        write_sidecar(f, keys, keys)
        os.utime(f, (1000 + h, 1000 + h))
        files.append(f)
    os.remove(files[0].with_name("seg.keys.npy"))  # too old to matter: never read (its Parquet is not even valid)
    index = DedupeIndex(max_keys=2500)
    assert index.load_new(root, set()) == files  # every file is now known
    assert len(index) == 2000  # three files read (3000 keys), the oldest run forgotten past 2500
    newest = np.arange(5001, 6001, dtype=np.uint64)
    assert not index.check(newest, newest).keep.any()
    assert index.check(np.array([1001], dtype=np.uint64), np.array([1], dtype=np.uint64)).keep.all()
