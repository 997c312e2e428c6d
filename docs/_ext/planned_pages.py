"""A MkDocs hook: nav entries for pages other people are still writing appear once the page exists.

``extra.planned_pages`` in mkdocs.yml lists such pages. Before the build, every nav entry that
names a planned page missing from ``docs/`` is dropped (logged at INFO), so the strict build
stays green meanwhile; any other nav entry naming a missing page still fails it. Once the
page exists it is simply in the nav, and it can leave the list.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.planned_pages")


def on_config(config, **kwargs):
    planned = set(config.extra.get("planned_pages", []))
    docs_dir = Path(config.docs_dir)
    missing = {page for page in planned if not (docs_dir / page).exists()}
    if missing:
        log.info("planned pages not written yet, left out of the nav: %s", ", ".join(sorted(missing)))
        config.nav = _without(config.nav, missing)
    return config


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
