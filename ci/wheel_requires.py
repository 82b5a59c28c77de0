"""Check that a folder of wheels installs, with ``--no-deps``, onto a known image without anything missing.

``ci/gpu_kit.sh`` calls it on ``.whl/`` after downloading. The GPU machine has no network, so
``pip install --no-index --no-deps`` there cannot notice a missing dependency: it shows up later
as an ``ImportError`` inside a stage, in minutes that cost money. This script reads every wheel's
``METADATA`` (``Requires-Dist``, ``Requires-Python``), evaluates each requirement's environment
marker for the target interpreter (CPython 3.12 on Linux x86-64, no extras requested), and checks
it against what the image provides (``--image FILE``) plus the other wheels in the folder. It also
refuses a wheel for a package the image already holds (a second CuPy, numpy or torch would shadow
the image's) and two wheels of one package.

Usage::

    python ci/wheel_requires.py --image IMAGE.txt [--python 3.12.3] [--max-mib 40] \
        [--waive NAME=REASON ...] WHEEL_OR_FOLDER...

``IMAGE.txt`` holds one package a line, ``name[extra,...] [version]`` (``#`` starts a comment);
a name without a version satisfies any version specifier, and a name with ``[extras]`` satisfies
requirements that ask for those extras. Exit status: 0 when every requirement is met, 1 naming
each unmet one, 2 for unreadable input. Only the standard library and ``packaging`` (or pip's
vendored copy) are used.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

__all__ = ["Provided", "check", "main", "read_image", "read_wheel"]


@dataclass
class Provided:
    """One package the target has: from the image list or from a wheel in the kit."""

    name: str
    version: str | None  # None: unknown, satisfies any specifier
    extras: frozenset[str] = frozenset()
    source: str = "image"
    requires: list[str] = field(default_factory=list)
    requires_python: str | None = None
    size: int = 0


def target_environment(python: str) -> dict[str, str]:
    """The marker environment of CPython ``python`` on manylinux x86-64, no extra requested."""
    major_minor = ".".join(python.split(".")[:2])
    return {
        "implementation_name": "cpython",
        "implementation_version": python,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": python,
        "python_version": major_minor,
        "sys_platform": "linux",
        "extra": "",
    }


def read_image(text: str) -> list[Provided]:
    """Parse an image list: ``name[extras] [version]`` a line, ``#`` comments.

    Examples
    --------
    >>> [(p.name, p.version, sorted(p.extras)) for p in read_image("cupy-cuda13x[ctk] 14.2.0  # CuPy\\nToolz")]
    [('cupy-cuda13x', '14.2.0', ['ctk']), ('toolz', None, [])]
    """
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?(?:\s+(\S+))?", line)
        if m is None:
            raise ValueError(f"image list line {lineno}: expected 'name[extras] [version]', found {line!r}")
        extras = frozenset(canonicalize_name(e) for e in (m.group(2) or "").split(",") if e.strip())
        out.append(Provided(canonicalize_name(m.group(1)), m.group(3), extras))
    return out


def read_wheel(path: str) -> Provided:
    """Name, version, ``Requires-Dist`` and ``Requires-Python`` of a wheel (or a bare METADATA file).

    Raises
    ------
    ValueError
        The wheel has no ``*.dist-info/METADATA`` or it lacks ``Name``/``Version``.
    """
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise ValueError(f"{path}: expected one *.dist-info/METADATA in the wheel, found {len(names)}")
            text = z.read(names[0]).decode("utf-8")
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    meta = HeaderParser().parsestr(text)
    if not meta.get("Name") or not meta.get("Version"):
        raise ValueError(f"{path}: METADATA has no Name or Version")
    return Provided(
        canonicalize_name(meta["Name"]),
        meta["Version"],
        frozenset(),
        os.path.basename(path),
        list(meta.get_all("Requires-Dist") or []),
        meta.get("Requires-Python"),
        os.path.getsize(path),
    )


def _unmet(req: Requirement, have: Provided | None) -> str | None:
    """Why ``have`` does not satisfy ``req`` (None when it does)."""
    if have is None:
        return "missing from the image and the kit"
    if have.version is not None and req.specifier and not req.specifier.contains(have.version, prereleases=True):
        return f"{have.source} has {have.version}"
    extras = {canonicalize_name(e) for e in req.extras} - have.extras
    if extras and have.source == "image":
        return f"the image's {have.name} is not listed with extra(s) {', '.join(sorted(extras))}"
    return None


def check(
    wheels: list[Provided], image: list[Provided], python: str, waived: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Every problem, one line each (unmet requirements, shadowed image packages, duplicates), and the waived ones.

    A wheel's extra requirements count only when another wheel asks for that extra
    (``dask[array]``); the kit's own wheels satisfy requirements at their exact versions.
    An unmet requirement on a package named in ``waived`` (name: reason) is not a
    problem but is listed with its reason in the second list.

    Examples
    --------
    >>> img = read_image("numpy 2.5.2\\ntoolz")
    >>> w = Provided("demo", "1.0", source="demo.whl", requires=["numpy>=2", "toolz", "zict>=3"])
    >>> check([w], img, "3.12.3")
    (['demo.whl: needs zict>=3: missing from the image and the kit'], [])
    >>> check([w], img, "3.12.3", {"zict": "not imported"})
    ([], ['demo.whl: needs zict>=3: missing from the image and the kit (waived: not imported)'])
    >>> check([Provided("numpy", "2.4.0", source="numpy.whl")], img, "3.12.3")[0]
    ['numpy.whl: the image already has numpy 2.5.2; a wheel of it would shadow it (drop it from the kit)']
    """
    env = target_environment(python)
    waived = {canonicalize_name(k): v for k, v in (waived or {}).items()}
    problems: list[str] = []
    waivers: list[str] = []
    provided: dict[str, Provided] = {p.name: p for p in image}
    seen: dict[str, str] = {}
    for w in wheels:
        if w.name in seen:
            problems.append(f"{w.source}: a second wheel of {w.name} (also {seen[w.name]}); keep one")
        seen[w.name] = w.source
        if w.name in provided and provided[w.name].source == "image":
            have = provided[w.name]
            problems.append(
                f"{w.source}: the image already has {w.name}"
                f"{' ' + have.version if have.version else ''}; a wheel of it would shadow it (drop it from the kit)"
            )
            continue
        provided[w.name] = w
    for w in wheels:
        if w.requires_python and not SpecifierSet(w.requires_python).contains(python, prereleases=True):
            problems.append(f"{w.source}: Requires-Python {w.requires_python} excludes Python {python}")
        wanted_extras = {
            canonicalize_name(e)
            for other in wheels
            for r in map(Requirement, other.requires)
            if canonicalize_name(r.name) == w.name and (r.marker is None or r.marker.evaluate(env))
            for e in r.extras
        }
        for text in w.requires:
            req = Requirement(text)
            marker: Marker | None = req.marker
            if marker is not None and not any(marker.evaluate({**env, "extra": e}) for e in ({""} | wanted_extras)):
                continue
            name = canonicalize_name(req.name)
            why = _unmet(req, provided.get(name))
            if why and name in waived:
                waivers.append(f"{w.source}: needs {text.split(';')[0].strip()}: {why} (waived: {waived[name]})")
            elif why:
                problems.append(f"{w.source}: needs {text.split(';')[0].strip()}: {why}")
    return problems, waivers


def main(argv: list[str] | None = None) -> int:
    """Command line: print one line per wheel, the problems, the total size; exit 1 on a problem."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("paths", nargs="+", help="wheels, METADATA files, or folders of wheels")
    ap.add_argument("--image", required=True, help="the target image's package list")
    ap.add_argument("--python", default="3.12.3", help="the target interpreter's version")
    ap.add_argument("--max-mib", type=float, default=None, help="fail when the wheels total more")
    ap.add_argument(
        "--waive", action="append", default=[], metavar="NAME=REASON", help="accept a missing package, saying why"
    )
    args = ap.parse_args(argv)
    try:
        with open(args.image, encoding="utf-8") as f:
            image = read_image(f.read())
        files = []
        for p in args.paths:
            files += (
                sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".whl")) if os.path.isdir(p) else [p]
            )
        wheels = [read_wheel(p) for p in files]
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        print(f"wheel_requires: {e}", file=sys.stderr)
        return 2
    if not wheels:
        print(f"wheel_requires: no wheels in {' '.join(args.paths)}", file=sys.stderr)
        return 2
    for w in wheels:
        print(f"  {w.size / 2**20:6.2f} MiB  {w.name} {w.version}: {len(w.requires)} Requires-Dist")
    total = sum(w.size for w in wheels)
    try:
        waived = dict(item.split("=", 1) for item in args.waive)
    except ValueError:
        print(f"wheel_requires: --waive takes NAME=REASON, got {args.waive}", file=sys.stderr)
        return 2
    problems, waivers = check(wheels, image, args.python, waived)
    for p in waivers:
        print(f"WAIVED {p}")
    for p in problems:
        print(f"UNMET {p}")
    print(f"total: {len(wheels)} wheels, {total / 2**20:.2f} MiB")
    if args.max_mib is not None and total > args.max_mib * 2**20:
        print(f"TOO BIG: {total / 2**20:.2f} MiB is over the {args.max_mib:g} MiB limit")
        return 1
    print("requirements: all met" if not problems else f"requirements: {len(problems)} unmet")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
