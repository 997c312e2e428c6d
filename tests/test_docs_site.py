"""The documentation site: it builds in strict mode, every page is reachable, and its examples run.

- ``mkdocs build --strict`` (mkdocs.yml): a broken link, a missing page, an API reference
  naming nothing, or a docstring cross-reference (``:class:`gflowdist.x.Y```) to an object
  that does not exist fails the build. Needs mkdocs and mkdocstrings[python]; without them
  the test fails and says how to install them.
- The nav of mkdocs.yml names only pages that exist or are planned; the nav hooks
  (docs/_ext/nav_hooks.py) hold back planned pages and append unlisted ones.
- The quick start's roles (``docs/quickstart.md``, copied into the README) run under
  ``gflowdist run`` with 3 ranks, and train.
- The docstring extension (docs/_ext/rst_roles.py) links what exists and warns on what does not.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.support.launching import MARKER_VARIABLE, REPO, base_env, kill_session, new_marker

DOCS = REPO / "docs"
MKDOCS_YML = REPO / "mkdocs.yml"
QUICKSTART = DOCS / "quickstart.md"
README = REPO / "README.md"
INSTALL_HINT = (
    "the docs tools are not installed: pip install -e '.[docs]' "
    "(or: pip install 'mkdocs>=1.6' 'mkdocstrings[python]>=0.25')"
)


def require_docs_tools() -> None:
    missing = [
        name
        for name in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")
        if importlib.util.find_spec(name.split(".")[0]) is None
        or (name.startswith("mkdocstrings_handlers") and importlib.util.find_spec(name) is None)
    ]
    if missing:
        pytest.fail(f"{INSTALL_HINT}; missing: {', '.join(missing)}", pytrace=False)


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the ```language fenced blocks of a Markdown text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def run_marked(argv: list[str], *, cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``argv`` in its own session; every process it started is killed before returning."""
    marker = new_marker()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=base_env(**{MARKER_VARIABLE: marker}),
        start_new_session=True,
    )
    proc.gflowdist_marker = marker
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        raise AssertionError(f"{' '.join(argv)} did not finish in {timeout} s:\n{proc.communicate()[0]}") from None
    finally:
        kill_session(proc)
    return proc.returncode, output


def test_the_site_builds_in_strict_mode(tmp_path):
    require_docs_tools()
    code, output = run_marked(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(MKDOCS_YML), "-d", str(tmp_path / "site")],
        cwd=REPO,
        timeout=240,
    )
    assert code == 0, f"mkdocs build --strict failed:\n{output}"
    assert (tmp_path / "site" / "api" / "runtime" / "index.html").exists()
    runtime = (tmp_path / "site" / "api" / "runtime" / "index.html").read_text()
    assert 'id="gflowdist.runtime.roles.Trainer"' in runtime
    assert 'href="../replay/#gflowdist.replay.buffer.ReplayBuffer"' in runtime, "roles became links"


def load_ext(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_nav_names_only_pages_that_exist_or_are_planned():
    config = yaml.load(MKDOCS_YML.read_text(), Loader=yaml.SafeLoader)
    nav_hooks = load_ext("nav_hooks")
    listed = set(nav_hooks.nav_pages(config["nav"]))
    pages = set(nav_hooks.doc_pages(DOCS))
    planned = set(config["extra"]["planned_pages"])
    assert listed - pages - planned == set(), f"nav names pages that do not exist: {sorted(listed - pages)}"
    assert planned & pages == set(), f"written pages still listed as planned: {sorted(planned & pages)}"
    assert pages - listed == set(), f"pages missing from the nav of mkdocs.yml: {sorted(pages - listed)}"
    assert {
        "index.md",
        "quickstart.md",
        "concepts.md",
        "configuration.md",
        "cluster.md",
        "performance.md",
        "troubleshooting.md",
        "migration.md",
        "migration-torchgfn.md",
    } <= listed


def test_planned_pages_wait_and_unlisted_pages_are_appended(tmp_path):
    nav_hooks = load_ext("nav_hooks")
    for name in ("index.md", "guide.md", "new.md", "sub/deep.md"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n")
    (tmp_path / "_ext").mkdir()
    (tmp_path / "_ext" / "notes.md").write_text("not a page\n")
    config = SimpleNamespace(
        docs_dir=str(tmp_path),
        extra={"planned_pages": ["later.md", "guide.md"]},
        nav=[{"Home": "index.md"}, {"Guides": [{"Guide": "guide.md"}, {"Later": "later.md"}]}],
    )
    config = nav_hooks.on_config(config)
    assert config.nav == [
        {"Home": "index.md"},
        {"Guides": [{"Guide": "guide.md"}]},
        {nav_hooks.MORE: ["new.md", "sub/deep.md"]},
    ]
    page = SimpleNamespace(file=SimpleNamespace(src_uri="sub/deep.md"))
    markdown = "See [later](../later.md#top), [the guide](../guide.md) and [web](https://x.org/later.md)."
    assert (
        nav_hooks.on_page_markdown(markdown, page=page)
        == "See later, [the guide](../guide.md) and [web](https://x.org/later.md)."
    )


def quickstart_files() -> tuple[str, str]:
    own_roles = section(QUICKSTART.read_text(), "Your own roles")
    return fenced_blocks(own_roles, "python")[0], fenced_blocks(own_roles, "yaml")[0]


def test_readme_shows_the_quickstart_roles_and_the_quickstart_shows_the_readme_commands():
    code, config = quickstart_files()
    readme = README.read_text()
    assert fenced_blocks(readme, "python")[0] == code, "README's roles example differs from docs/quickstart.md"
    assert fenced_blocks(readme, "yaml")[0] == config, "README's config differs from docs/quickstart.md"
    commands = readme.split("```", 2)[1]
    assert f"```{commands}```" in QUICKSTART.read_text(), (
        "docs/quickstart.md must show the README's first code block unchanged: copy it over"
    )


def test_quickstart_roles_run_under_gflowdist_with_three_ranks(tmp_path):
    code, config_text = quickstart_files()
    (tmp_path / "my_roles.py").write_text(code)
    (tmp_path / "config.yaml").write_text(config_text)
    config = yaml.safe_load(config_text)
    steps = 12
    exit_code, output = run_marked(
        [
            sys.executable,
            "-m",
            "gflowdist",
            "run",
            "config.yaml",
            "-n",
            "3",
            f"run.steps={steps}",
            "run.log_every=4",
            f"run.out_dir={tmp_path / 'runs'}",
        ],
        cwd=tmp_path,
        timeout=180,
    )
    assert exit_code == 0, output
    produced = steps * config["params"]["batch"]  # 1 trainer: one rollout of `batch` arms per step
    assert f"done: {produced} trajectories produced, {produced} admitted, 0 dropped, ledger balanced" in output
    assert "Warning" not in output, output
    (run_dir,) = (tmp_path / "runs").glob("arms-*")
    finals = json.loads((run_dir / "finals.json").read_text())
    buffer = next(f for f in finals.values() if f["role"] == "buffer")
    best = math.log(max(config["params"]["rewards"]))
    assert buffer["summary"]["best_log_reward"] == pytest.approx(best, rel=1e-6)
    l1 = [row["l1"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    assert len(l1) >= 3 and l1[-1] < l1[0], f"the policy did not move toward R/Z: {l1}"


def test_docstring_roles_become_links_and_a_dangling_one_is_reported(tmp_path, caplog):
    require_docs_tools()
    import griffe

    rst_roles = load_ext("rst_roles")
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""See :class:`~fakepkg.core.Thing` and :mod:`fakepkg.core`."""\nfrom fakepkg.core import Thing\n'
    )
    (package / "core.py").write_text(
        '"""Holds :class:`Thing`; :meth:`Thing.go` runs it; :func:`importlib.import_module` is elsewhere.\n\n'
        'Example::\n\n    Thing().go()\n"""\n\n\n'
        'class Thing:\n    """Calls :meth:`go`, unlike :func:`fakepkg.core.gone`."""\n\n'
        '    def go(self):\n        """Go."""\n'
    )

    class FakeRoles(rst_roles.RstRoles):
        package = "fakepkg"

    with caplog.at_level(logging.WARNING, logger=rst_roles.log.name):
        loaded = griffe.load("fakepkg", search_paths=[str(tmp_path)], extensions=griffe.load_extensions(FakeRoles()))
    assert loaded.docstring.value == "See [`Thing`][fakepkg.core.Thing] and [`fakepkg.core`][fakepkg.core]."
    core = loaded["core"].docstring.value
    assert core.startswith(
        "Holds [`Thing`][fakepkg.core.Thing]; [`Thing.go`][fakepkg.core.Thing.go] runs it; "
        "`importlib.import_module` is elsewhere."
    )
    assert "Example:\n\n    Thing().go()" in core
    assert loaded["core.Thing"].docstring.value == "Calls [`go`][fakepkg.core.Thing.go], unlike `fakepkg.core.gone`."
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == ["docstring of fakepkg.core.Thing: :func:`fakepkg.core.gone` names nothing in fakepkg"]
