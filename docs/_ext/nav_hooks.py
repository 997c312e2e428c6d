"""MkDocs hooks that keep the nav whole while several people write pages at once.

- **Planned pages.** ``extra.planned_pages`` in mkdocs.yml lists pages others are still
  writing. While one is missing from ``docs/``, its nav entry is dropped and a Markdown link
  to it (``[text](page.md)``) is shown as its plain text, both logged at INFO, so the strict
  build stays green meanwhile. Any other missing page, nav entry or link still fails the
  strict build. Once the page exists nothing is changed, and it can leave the list.
- **Unlisted pages.** A page in ``docs/`` that the nav does not name is appended under
  "More pages" (logged at INFO) instead of being unreachable, until someone gives it its
  place in mkdocs.yml. Whoever adds a page needs no change to mkdocs.yml for the build to pass.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.planned_pages")


LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+\.md)(#[^)\s]*)?\)")
_MISSING: set[str] = set()


MORE = "More pages"


def on_config(config, **kwargs):
    planned = set(config.extra.get("planned_pages", []))
    docs_dir = Path(config.docs_dir)
    _MISSING.clear()
    _MISSING.update(page for page in planned if not (docs_dir / page).exists())
    if _MISSING:
        log.info("planned pages not written yet, left out of the nav: %s", ", ".join(sorted(_MISSING)))
        config.nav = _without(config.nav, _MISSING)
    unlisted = sorted(set(doc_pages(docs_dir)) - set(nav_pages(config.nav)))
    if unlisted:
        log.info("pages not in the nav of mkdocs.yml, listed under '%s': %s", MORE, ", ".join(unlisted))
        config.nav = [*config.nav, {MORE: unlisted}]
    return config


def doc_pages(docs_dir: Path) -> list[str]:
    """Every Markdown page of the site (``_ext/`` holds these hooks, not pages)."""
    return [p.relative_to(docs_dir).as_posix() for p in docs_dir.rglob("*.md") if "_ext" not in p.parts]


def nav_pages(nav) -> list[str]:
    """The pages a nav names, depth first."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def on_page_markdown(markdown: str, *, page, **kwargs) -> str:
    if not _MISSING:
        return markdown
    here = posixpath.dirname(page.file.src_uri)

    def unlink(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(here, match.group(2)))
        if target not in _MISSING:
            return match.group(0)
        log.info("%s: link to %s (not written yet) shown as text", page.file.src_uri, target)
        return match.group(1)

    return LINK.sub(unlink, markdown)


def _without(nav, missing: set[str]):
    if isinstance(nav, str):
        return None if nav in missing else nav
    if isinstance(nav, list):
        kept = [_without(item, missing) for item in nav]
        return [item for item in kept if item not in (None, [], {})]
    if isinstance(nav, dict):
        kept = {title: _without(value, missing) for title, value in nav.items()}
        return {title: value for title, value in kept.items() if value not in (None, [], {})}
    return nav
