"""The node cache's on-disk layout: one file per extent against one sparse file per object version.

Two layouts hold the same extents (byte runs of remote objects, each with a CRC per block of at
most 1 MiB) in one folder, written and read by this process:

* **A, one file per extent** (``npydask.cache.entry``): each extent is a file of a header (key,
  ETag, offset, length, block checksums, header CRC) and the bytes, written to a temporary,
  ``fsync``\\ ed, renamed over its name, the folder ``fsync``\\ ed. A reader opens one file and
  checks everything in it. Eviction unlinks the file.
* **B, one sparse file per object version plus an extent map**: the bytes are written with
  ``pwrite`` at their object offsets into ``<entry>.data`` (``fsync``), then, under an ``flock``
  of the data file, the map ``<entry>.map`` (every extent's offset, length and block CRCs, and a
  CRC of the whole map) is read, extended, written to a temporary, ``fsync``\\ ed and renamed
  (folder ``fsync``). A reader keeps the parsed map of each entry in memory while the map file's
  inode and mtime stay the same (B's best case), ``pread``\\ s the bytes and checks their CRCs.
  Eviction punches a hole (``fallocate(PUNCH_HOLE)``) and rewrites the map.

Cases, each a set of disjoint extents written once and read once (page cache warm for both):

* ``small objects``: N whole objects of 64 KiB;
* ``ROI extents``: 200 extents of 1 MiB at random places of each of a few 1 GiB objects;
* ``random extents``: extents of 4 KiB..256 KiB (log-uniform) at random places of 64 MiB objects.

Columns: admission and read time per extent (median of ``--repeat`` runs, each into a fresh
folder), disk use (``st_blocks`` of every file) over the bytes held, files created, and the time
to evict half the extents. Then a kill test per layout: a writer process admitting random extents
is SIGKILLed at a random time, ``--kills`` times, and the folder is checked the way the next
process that opens it would: temporaries left, extents that fail their checks (torn), bytes in
the data files no map references (B), and the time that recovery takes (A: list the folder,
remove temporaries, sum sizes; B: the same plus re-validating every extent of every map, since a
map is only a claim about a file another process wrote).

Usage::

    python benchmarks/bench_cache_layout.py [--size tiny|small|full] [--repeat N] [--kills K]
        [--folder DIR] [--json out.json]
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from npydask.cache.checksum import BLOCK_SIZE, ChecksumRecord, checksums, preferred_algorithm, verify  # noqa: E402
from npydask.cache.entry import read_extent, write_extent  # noqa: E402
from npydask.cache.keys import EntryKey  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# (small objects, ROI objects of 200 extents, random extents), kills
SIZES = {
    "tiny": ((20, 1, 20), 1),
    "small": ((2_000, 2, 2_000), 10),
    "full": ((20_000, 5, 20_000), 10),
}
ROI_EXTENTS = 3  # per ROI object at size tiny (200 otherwise)
RANDOM_OBJECT = 64 * MiB
RANDOM_PER_OBJECT = 100
PERIOD = MiB + 4099  # object bytes repeat with this period: overlapping extents agree on their bytes
POOL = np.random.default_rng(0).bytes(PERIOD) * 2
ALGO = preferred_algorithm()

Extent = tuple[int, int, int]  # (object index, offset, length)


def object_key(i: int, size: int) -> EntryKey:
    return EntryKey.of("s3://bench", f"objects/{i:06d}.npy", "", size, f'"v{i}"')


def payload(i: int, offset: int, length: int) -> memoryview:
    """Deterministic bytes of object ``i`` at ``offset`` (at most 1 MiB; a function of the position)."""
    h = (i * 1_000_003 + offset) % PERIOD
    return memoryview(POOL)[h : h + length]


def disjoint(rng: random.Random, size: int, lengths: list[int]) -> list[tuple[int, int]]:
    """Random disjoint (offset, length) of ``lengths`` inside an object of ``size`` bytes."""
    free = size - sum(lengths)
    cuts = sorted(rng.randrange(free + 1) for _ in lengths)
    out, pos = [], 0
    for k, length in enumerate(lengths):
        gap = cuts[k] - (cuts[k - 1] if k else 0)
        pos += gap
        out.append((pos, length))
        pos += length
    return out


def cases(size: str, seed: int = 1) -> dict[str, tuple[dict[int, int], list[Extent]]]:
    """case name -> (object index -> object size, extents in admission order)."""
    (n_small, n_roi, n_random), _ = SIZES[size]
    rng = random.Random(seed)
    out: dict[str, tuple[dict[int, int], list[Extent]]] = {}
    out["small objects 64 KiB"] = ({i: 64 * KiB for i in range(n_small)}, [(i, 0, 64 * KiB) for i in range(n_small)])
    per = ROI_EXTENTS if size == "tiny" else 200
    roi: list[Extent] = []
    for i in range(n_roi):
        roi += [(i, off, n) for off, n in disjoint(rng, GiB, [MiB] * per)]
    rng.shuffle(roi)
    out[f"ROI extents 1 MiB ({per}/object)"] = ({i: GiB for i in range(n_roi)}, roi)
    objects = max(1, -(-n_random // RANDOM_PER_OBJECT))
    rand: list[Extent] = []
    for i in range(objects):
        lengths = [int(2 ** rng.uniform(12, 18)) for _ in range(min(RANDOM_PER_OBJECT, n_random - len(rand)))]
        rand += [(i, off, n) for off, n in disjoint(rng, RANDOM_OBJECT, lengths)]
    rng.shuffle(rand)
    out["random extents 4-256 KiB"] = ({i: RANDOM_OBJECT for i in range(objects)}, rand)
    return out


# ------------------------------------------------------------------------------------------------
# layout A: one file per extent


class LayoutA:
    name = "A: file per extent"

    def __init__(self, folder: str, sizes: dict[int, int]) -> None:
        self.dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        self.keys = {i: object_key(i, s) for i, s in sizes.items()}

    def _name(self, i: int, offset: int, length: int) -> str:
        return f"{self.keys[i].entry_name()[:40]}-{offset:x}-{length:x}"

    def admit(self, i: int, offset: int, length: int) -> None:
        write_extent(self.dir_fd, self._name(i, offset, length), self.keys[i], offset, payload(i, offset, length))

    def read(self, i: int, offset: int, length: int) -> bytes | None:
        return read_extent(self.dir_fd, self._name(i, offset, length), self.keys[i], offset, length)

    def evict(self, i: int, offset: int, length: int) -> None:
        os.unlink(self._name(i, offset, length), dir_fd=self.dir_fd)

    def close(self) -> None:
        os.close(self.dir_fd)


# ------------------------------------------------------------------------------------------------
# layout B: a sparse file per object version plus an extent map

MAP_MAGIC = b"NPDXMAP\x00"
_MAP_HEAD = struct.Struct("<8sI")  # magic, extents
_MAP_EXTENT = struct.Struct("<QQII")  # offset, length, block size, sums


def encode_map(extents: dict[tuple[int, int], tuple[int, ...]]) -> bytes:
    parts = [_MAP_HEAD.pack(MAP_MAGIC, len(extents))]
    for (offset, length), sums in sorted(extents.items()):
        parts.append(_MAP_EXTENT.pack(offset, length, BLOCK_SIZE, len(sums)))
        parts.append(struct.pack(f"<{len(sums)}I", *sums))
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_map(blob: bytes) -> dict[tuple[int, int], tuple[int, ...]] | None:
    """The extents of a map, or None for a damaged one."""
    if len(blob) < _MAP_HEAD.size + 4 or struct.unpack_from("<I", blob, len(blob) - 4)[0] != zlib.crc32(blob[:-4]):
        return None
    magic, n = _MAP_HEAD.unpack_from(blob)
    if magic != MAP_MAGIC:
        return None
    out, pos = {}, _MAP_HEAD.size
    for _ in range(n):
        offset, length, _block, k = _MAP_EXTENT.unpack_from(blob, pos)
        pos += _MAP_EXTENT.size
        out[(offset, length)] = struct.unpack_from(f"<{k}I", blob, pos)
        pos += 4 * k
    return out


def _punch_hole():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = libc.fallocate
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]

    def punch(fd: int, offset: int, length: int) -> None:
        if fn(fd, 3, offset, length) != 0:  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    return punch


PUNCH = _punch_hole()


class LayoutB:
    name = "B: sparse file + map"

    def __init__(self, folder: str, sizes: dict[int, int]) -> None:
        self.dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        self.keys = {i: object_key(i, s) for i, s in sizes.items()}
        self.fds: dict[int, int] = {}  # open data files (B's best case: kept open)
        self.maps: dict[int, tuple[tuple[int, int], dict]] = {}  # parsed maps by (inode, mtime)

    def _data_fd(self, i: int) -> int:
        fd = self.fds.get(i)
        if fd is None:
            fd = os.open(f"{self.keys[i].entry_name()}.data", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=self.dir_fd)
            self.fds[i] = fd
        return fd

    def _load(self, i: int) -> dict[tuple[int, int], tuple[int, ...]]:
        name = f"{self.keys[i].entry_name()}.map"
        try:
            st = os.stat(name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return {}
        stamp = (st.st_ino, st.st_mtime_ns)
        held = self.maps.get(i)
        if held is not None and held[0] == stamp:
            return held[1]
        fd = os.open(name, os.O_RDONLY, dir_fd=self.dir_fd)
        try:
            blob = os.pread(fd, st.st_size, 0)
        finally:
            os.close(fd)
        extents = decode_map(blob) or {}
        self.maps[i] = (stamp, extents)
        return extents

    def _publish(self, i: int, extents: dict) -> None:
        name = f"{self.keys[i].entry_name()}.map"
        temp = f".tmp-{name}-{os.getpid()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=self.dir_fd)
        try:
            blob = encode_map(extents)
            os.write(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def admit(self, i: int, offset: int, length: int) -> None:
        data = payload(i, offset, length)
        fd = self._data_fd(i)
        view = data
        pos = offset
        while view:
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
        os.fsync(fd)
        sums = checksums(data, algorithm=ALGO).sums
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            extents = dict(self._load(i))
            extents[(offset, length)] = sums
            self._publish(i, extents)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self, i: int, offset: int, length: int) -> bytes | None:
        sums = self._load(i).get((offset, length))
        if sums is None:
            return None
        data = os.pread(self._data_fd(i), length, offset)
        return data if verify(data, ChecksumRecord(ALGO, BLOCK_SIZE, length, sums)) else None

    def evict(self, i: int, offset: int, length: int) -> None:
        fd = self._data_fd(i)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            extents = dict(self._load(i))
            extents.pop((offset, length), None)
            self._publish(i, extents)
            PUNCH(fd, offset, length)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        os.close(self.dir_fd)


LAYOUTS = (LayoutA, LayoutB)


def disk_use(folder: str) -> tuple[int, int]:
    """(bytes of st_blocks, files) of every file in ``folder``."""
    used = files = 0
    for entry in os.scandir(folder):
        st = entry.stat(follow_symlinks=False)
        used += st.st_blocks * 512
        files += 1
    return used, files


def run_case(layout, sizes, extents, base: str, repeat: int) -> dict:
    admit_t, read_t, evict_t = [], [], []
    used = files = 0
    held = sum(n for _, _, n in extents)
    for _ in range(max(1, repeat)):
        folder = tempfile.mkdtemp(dir=base)
        try:
            cache = layout(folder, sizes)
            t0 = time.perf_counter()
            for e in extents:
                cache.admit(*e)
            admit_t.append((time.perf_counter() - t0) / len(extents))
            cache.close()
            cache = layout(folder, sizes)  # a reader starts with nothing in memory
            t0 = time.perf_counter()
            for i, off, n in extents:
                got = cache.read(i, off, n)
                if got is None or got != payload(i, off, n):
                    raise AssertionError(f"{layout.name}: the extent ({i}, {off}, {n}) did not read back")
            read_t.append((time.perf_counter() - t0) / len(extents))
            used, files = disk_use(folder)
            half = extents[::2]
            t0 = time.perf_counter()
            for e in half:
                cache.evict(*e)
            evict_t.append((time.perf_counter() - t0) / len(half))
            for i, off, n in extents[1::2]:  # what is left still reads back
                if cache.read(i, off, n) != payload(i, off, n):
                    raise AssertionError(f"{layout.name}: ({i}, {off}, {n}) lost by evicting others")
            cache.close()
        finally:
            shutil.rmtree(folder)
    return {
        "admit_s": _common.median(admit_t),
        "read_s": _common.median(read_t),
        "evict_s": _common.median(evict_t),
        "disk_bytes": used,
        "held_bytes": held,
        "files": files,
        "extents": len(extents),
    }


# ------------------------------------------------------------------------------------------------
# the kill test


def child(layout, folder: str, seed: int, ready: int) -> None:
    """Admit random extents of one object forever (until killed); writes to ``ready`` after the first."""
    rng = random.Random(seed)
    cache = layout(folder, {0: RANDOM_OBJECT})
    first = True
    while True:
        length = int(2 ** rng.uniform(12, 18))
        offset = rng.randrange(0, RANDOM_OBJECT - length) & ~4095
        cache.admit(0, offset, length)
        if first:
            os.write(ready, b"r")
            os.close(ready)
            first = False


def kill_test(layout, base: str, kills: int, seed: int = 7) -> dict:
    folder = tempfile.mkdtemp(dir=base)
    rng = random.Random(seed)
    try:
        for k in range(kills):
            # a forked writer (this script runs no threads): no second interpreter to start
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    child(layout, folder, seed * 100 + k, w)
                finally:
                    os._exit(1)
            os.close(w)
            started = os.read(r, 1)
            os.close(r)
            if started != b"r":
                os.waitpid(pid, 0)
                raise RuntimeError("the writer did not start")
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        t0 = time.perf_counter()
        temps = torn = valid = orphan = 0
        names = os.listdir(folder)
        for name in names:
            if name.startswith(".tmp-"):
                os.unlink(os.path.join(folder, name))
                temps += 1
        if layout is LayoutA:
            held = 0
            for name in names:
                if not name.startswith(".tmp-"):
                    held += os.stat(os.path.join(folder, name)).st_size
            recount_s = time.perf_counter() - t0
            # not part of recovery: a reader checks each file when it reads it
            cache = LayoutA(folder, {0: RANDOM_OBJECT})
            for name in names:
                if name.startswith(".tmp-"):
                    continue
                _, off, n = name.rsplit("-", 2)
                ok = cache.read(0, int(off, 16), int(n, 16)) is not None
                valid += ok
                torn += not ok
            cache.close()
        else:
            cache = LayoutB(folder, {0: RANDOM_OBJECT})
            extents = cache._load(0)
            held = 0
            for off, n in extents:
                ok = cache.read(0, off, n) is not None
                valid += ok
                torn += not ok
                held += n
            recount_s = time.perf_counter() - t0
            data = os.path.join(folder, f"{cache.keys[0].entry_name()}.data")
            orphan = max(0, os.stat(data).st_blocks * 512 - held) if os.path.exists(data) else 0
            cache.close()
        return {
            "kills": kills,
            "temps_left": temps,
            "torn": torn,
            "valid": valid,
            "orphan_bytes": orphan,
            "recovery_s": recount_s,
        }
    finally:
        shutil.rmtree(folder)


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__.splitlines()[0], default_repeat=1)
    p.add_argument("--kills", type=int, default=None, help="SIGKILLs of a writer per layout (default by size)")
    p.add_argument("--folder", default=None, help="where to make the cache folders (default: the temp folder)")
    args = p.parse_args(argv)
    info = _common.environment()
    _common.print_environment(info)
    base = tempfile.mkdtemp(dir=args.folder, prefix="npydask-layout-")
    kills = SIZES[args.size][1] if args.kills is None else args.kills
    results: list[dict] = []
    rows = []
    try:
        for case, (sizes, extents) in cases(args.size).items():
            got = {layout: run_case(layout, sizes, extents, base, args.repeat) for layout in LAYOUTS}
            a, b = got[LayoutA], got[LayoutB]
            for layout, r in got.items():
                results.append({"case": case, "layout": layout.name, **r})
                rows.append(
                    [
                        case if layout is LayoutA else "",
                        layout.name,
                        f"{r['extents']:,}",
                        _common.fmt_seconds(r["admit_s"]),
                        _common.fmt_seconds(r["read_s"]),
                        _common.fmt_seconds(r["evict_s"]),
                        f"{r['disk_bytes'] / r['held_bytes']:.3f}",
                        f"{r['files']:,}",
                    ]
                )
            rows.append(
                [
                    "",
                    "A / B",
                    "",
                    f"{a['admit_s'] / b['admit_s']:.2f}",
                    f"{a['read_s'] / b['read_s']:.2f}",
                    f"{a['evict_s'] / b['evict_s']:.2f}",
                    f"{(a['disk_bytes'] / a['held_bytes']) / (b['disk_bytes'] / b['held_bytes']):.2f}",
                    f"{a['files'] / b['files']:.2f}",
                ]
            )
        _common.table(
            rows, ["case", "layout", "extents", "admit/extent", "read/extent", "evict/extent", "disk/held", "files"]
        )
        krows = []
        kill_results = {}
        for layout in LAYOUTS:
            r = kill_test(layout, base, kills)
            kill_results[layout.name] = r
            results.append({"case": "SIGKILL", "layout": layout.name, **r})
            krows.append(
                [
                    layout.name,
                    r["kills"],
                    r["temps_left"],
                    r["valid"],
                    r["torn"],
                    f"{r['orphan_bytes']:,}",
                    _common.fmt_seconds(r["recovery_s"]),
                    "no" if layout is LayoutA else "yes (every extent of every map)",
                ]
            )
        print(f"# a writer of random extents SIGKILLed at a random time, {kills} times per layout")
        _common.table(
            krows,
            ["layout", "kills", "temps left", "valid", "torn", "orphan bytes", "recovery", "re-validate on open"],
        )
        # A is chosen unless B is at least 1.5x faster to admit or to read in most cases: A is torn-free by
        # construction, evicts by unlink, needs no map re-validation; B's one advantage is fewer files
        cases_ = [r for r in results if r["case"] != "SIGKILL"]
        faster_b = 0
        for case in {r["case"] for r in cases_}:
            ra = next(r for r in cases_ if r["case"] == case and r["layout"] == LayoutA.name)
            rb = next(r for r in cases_ if r["case"] == case and r["layout"] == LayoutB.name)
            faster_b += ra["admit_s"] >= 1.5 * rb["admit_s"] or ra["read_s"] >= 1.5 * rb["read_s"]
        torn = sum(r["torn"] for r in kill_results.values())
        choice = "B" if 2 * faster_b > len({r["case"] for r in cases_}) else "A"
        print(
            f"verdict: layout {choice} ({'one file per extent' if choice == 'A' else 'sparse file + map'}): "
            f"B 1.5x faster in {faster_b} of 3 cases; torn after {kills} kills: "
            f"A {kill_results[LayoutA.name]['torn']}, B {kill_results[LayoutB.name]['torn']}; "
            f"B leaves {kill_results[LayoutB.name]['orphan_bytes']:,} unreferenced bytes and must re-validate "
            f"its maps on open (torn total {torn})"
        )
        _common.write_json(args.json, {"environment": info, "results": results, "verdict": choice})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
