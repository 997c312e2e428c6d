"""Host lists written by hand: ``"a,b,a,b"`` (one name per rank) or ``"a:2,b:2"`` (run length)."""

from __future__ import annotations

from gflowdist.errors import LayoutError

__all__ = ["parse_host_list"]


def parse_host_list(spec: str) -> tuple[str, ...]:
    """Expand a host list to one name per rank.

    Items are separated by commas; ``name:count`` repeats ``name`` ``count``
    times (``count >= 1``), a bare ``name`` counts once, and the two forms mix:
    ``"a:2,b"`` -> ``("a", "a", "b")``.
    """
    hosts: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        name, sep, count_text = item.partition(":")
        name = name.strip()
        if not name:
            raise LayoutError(f"empty host name in host list {spec!r}")
        count = 1
        if sep:
            count_text = count_text.strip()
            if not count_text.isdigit() or int(count_text) < 1:
                raise LayoutError(
                    f"host list item {item!r}: the count after ':' must be a positive integer, found {count_text!r}"
                )
            count = int(count_text)
        hosts.extend([name] * count)
    return tuple(hosts)
