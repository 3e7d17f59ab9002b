"""The memory this process may use: the limit of its memory cgroup, else physical RAM; and
how much of it is still free.

A packed file larger than this cannot stay in the page cache, so a random order reads it
from disk again and again; ``memory_limit`` is what the loader compares file sizes with.
Both cgroup versions are read: v1 (``memory.limit_in_bytes``) and v2 (``memory.max``),
of the process's own cgroup (``/proc/self/cgroup``) and of every cgroup above it, since a
parent's limit binds its children too. What is still free (``memory_room``) is measured
the same way: a limit less what is charged to its cgroup (v1 ``memory.usage_in_bytes``,
v2 ``memory.current``), where the page cache that the kernel lets go of first (the
``inactive_file`` of ``memory.stat``) counts as free; and the system's ``MemAvailable``.
"""

from __future__ import annotations

import os

# (limit, (cgroup directory, limit file)) of a limited cgroup
_Limit = tuple[int, tuple[str, str]]

__all__ = ["memory_limit", "memory_room", "readable_bytes"]

_UNLIMITED = 1 << 60  # v1 writes "no limit" as a huge number (2^63 rounded to pages)


def memory_limit() -> int | None:
    """Bytes of memory this process may use: the smallest of physical RAM and the limits
    of its memory cgroup and the cgroups above it (Linux; elsewhere RAM, or None when the
    platform does not say)."""
    found = [_physical_memory(), *_cgroup_limits()]
    limits = [x for x in found if x is not None]
    return min(limits) if limits else None


def memory_room(
    held: int = 0,
    cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
    meminfo: str = "/proc/meminfo",
) -> int | None:
    """Bytes of memory still free to this process before its tightest limit, not counting
    ``held`` (bytes of page cache this process holds on purpose) as free: per limited
    cgroup (its own and those above it), the limit less its usage plus the inactive page
    cache beyond ``held``; and ``MemAvailable`` less ``held``. At least 0; None where the
    platform says neither (not Linux). ``cgroup``, ``mountinfo``, ``meminfo``: where
    those are read."""
    rooms = [
        limit - used + max(0, inactive - held)
        for limit, used, inactive in _cgroup_usages(cgroup, mountinfo)
    ]
    available = _meminfo("MemAvailable", meminfo)
    if available is not None:
        rooms.append(available - held)
    return max(0, min(rooms)) if rooms else None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limits(
    cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> list[int]:
    """The memory limits of this process's cgroup and its ancestors (bytes), v1 and v2:
    ``cgroup`` lists the process's cgroups, ``mountinfo`` where their file systems are."""
    return [limit for limit, _ in _cgroup_dirs(cgroup, mountinfo)]


def _cgroup_usages(
    cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> list[tuple[int, int, int]]:
    """(limit, usage, inactive page cache) in bytes of each limited cgroup of this process
    and its ancestors whose usage can be read."""
    found = []
    for limit, (directory, name) in _cgroup_dirs(cgroup, mountinfo):
        v1 = name == "memory.limit_in_bytes"
        used = _read_limit(
            os.path.join(directory, "memory.usage_in_bytes" if v1 else "memory.current")
        )
        if used is not None:
            stat = _memory_stat(os.path.join(directory, "memory.stat"))
            inactive = stat.get("total_inactive_file" if v1 else "inactive_file", 0)
            found.append((limit, used, inactive))
    return found


def _cgroup_dirs(cgroup: str, mountinfo: str) -> list[_Limit]:
    """(limit, (directory, limit file)) of each limited cgroup of this process and its
    ancestors."""
    try:
        with open(cgroup) as f:
            lines = f.read().splitlines()
        with open(mountinfo) as f:
            mounts = f.read().splitlines()
    except OSError:
        return []
    limits: list[_Limit] = []
    for line in lines:
        if line.count(":") < 2:
            continue
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            limits += _limits_under(_mount_of(mounts, "cgroup2", None), path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits_under(
                _mount_of(mounts, "cgroup", "memory"), path, "memory.limit_in_bytes"
            )
    return limits


def _mount_of(mounts: list[str], fstype: str, controller: str | None) -> tuple[str, str] | None:
    """(mount point, root within the hierarchy) of the cgroup file system ``fstype``
    (with ``controller`` among its options for v1), or None."""
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3 or after[0] != fstype:
            continue
        if controller is not None and controller not in after[2].split(","):
            continue
        return fields[4], fields[3]
    return None


def _limits_under(mount: tuple[str, str] | None, path: str, name: str) -> list[_Limit]:
    """(value, (directory, file)) of file ``name`` in the cgroup ``path`` and its
    ancestors, up to the mount point; "max" and v1's "no limit" are left out."""
    if mount is None:
        return []
    point, root = mount
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    parts = [p for p in path.split("/") if p]
    limits: list[_Limit] = []
    for depth in range(len(parts), -1, -1):
        directory = os.path.join(point, *parts[:depth])
        value = _read_limit(os.path.join(directory, name))
        if value is not None:
            limits.append((value, (directory, name)))
    return limits


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if value < _UNLIMITED else None


def _memory_stat(path: str) -> dict[str, int]:
    """The counters of a cgroup's ``memory.stat`` (bytes), {} when it cannot be read."""
    try:
        with open(path) as f:
            pairs = [line.split() for line in f]
    except OSError:
        return {}
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _meminfo(name: str, path: str = "/proc/meminfo") -> int | None:
    """A ``/proc/meminfo`` value in bytes, or None."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name and value.split()[0].isdigit():
                    return int(value.split()[0]) * 1024
    except OSError:
        pass
    return None


def readable_bytes(n: int | float) -> str:
    """``n`` bytes in the unit that shows them: ``"512 B"``, ``"93.2 KB"``, ``"4.19 MB"``,
    ``"1.5 GB"`` (powers of 1000, three significant digits)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{int(n)} B"
