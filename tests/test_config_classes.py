"""load_class: role classes named in a config, by module or by file, and every way it can fail."""

from __future__ import annotations

import collections
import os
import textwrap
from pathlib import Path

import pytest

from gflowdist.config import Config, ConfigError, load_class

ROLES_PY = textwrap.dedent("""
    class Base:
        pass

    class GridTrainer(Base):
        class Inner:
            pass

    def not_a_class():
        return 1
""")


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "roles_here.py").write_text(ROLES_PY)
    (folder / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (folder / "run.yaml").write_text("roles: {trainer: roles_here.py:GridTrainer}\n")
    return folder


def test_module_reference() -> None:
    assert load_class("collections:OrderedDict", key="roles.buffer") is collections.OrderedDict


def test_file_reference_relative_to_the_config_file(
    config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not the config directory: resolution must use the file
    cls = load_class("roles_here.py:GridTrainer", key="roles.trainer", file=str(config_dir / "run.yaml"))
    assert cls.__name__ == "GridTrainer"
    again = load_class("roles_here.py:GridTrainer", key="roles.trainer", file=str(config_dir / "run.yaml"))
    assert again is cls  # the file is loaded once
    inner = load_class("roles_here.py:GridTrainer.Inner", key="roles.trainer", file=str(config_dir / "run.yaml"))
    assert inner is cls.Inner


def test_file_reference_falls_back_to_cwd(config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(config_dir)
    other = tmp_path / "elsewhere.yaml"
    cls = load_class("roles_here.py:Base", key="roles.actor", file=str(other))
    assert cls.__name__ == "Base"


def test_config_role_class(config_dir: Path) -> None:
    cfg = Config.from_yaml(config_dir / "run.yaml")
    cls = cfg.role_class("trainer")
    assert cls is not None and cls.__name__ == "GridTrainer"
    assert cfg.role_class("actor") is None
    base = load_class("roles_here.py:Base", key="k", file=str(config_dir / "run.yaml"))
    assert cfg.role_class("trainer", base=base) is cls
    with pytest.raises(ConfigError, match=r"unknown role 'trainr'.*did you mean 'trainer'"):
        cfg.role_class("trainr")


FAILURES = [
    ("no_such_module_xyz:Thing", "cannot import module 'no_such_module_xyz'"),
    ("collections.nope:Thing", "no module named 'collections.nope'"),
    ("collections:OrderedDcit", "has no attribute 'OrderedDcit' (did you mean 'OrderedDict'?)"),
    ("missing_file.py:Thing", "file 'missing_file.py' not found (looked in"),
    ("roles_here.py:GridTrainr", "has no attribute 'GridTrainr' (did you mean 'GridTrainer'?)"),
    ("roles_here.py:not_a_class", "is a function, not a class"),
    ("roles_here.py:GridTrainer.Missing", "'roles_here.py:GridTrainer' has no attribute 'Missing'"),
    ("broken.py:Anything", "raised RuntimeError: boom at import"),
    ("os.path", "expected 'package.module:Class'"),
]


@pytest.mark.parametrize("ref, words", FAILURES)
def test_failures_name_the_key_and_file(config_dir: Path, ref: str, words: str) -> None:
    config_file = str(config_dir / "run.yaml")
    with pytest.raises(ConfigError) as info:
        load_class(ref, key="roles.trainer", file=config_file)
    assert info.value.key == "roles.trainer"
    assert info.value.file == config_file
    assert words in str(info.value)


def test_base_class_is_enforced(config_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"must be a subclass of collections.OrderedDict"):
        load_class(
            "roles_here.py:GridTrainer",
            key="roles.trainer",
            file=str(config_dir / "run.yaml"),
            base=collections.OrderedDict,
        )


def test_absolute_path(config_dir: Path) -> None:
    path = os.path.join(str(config_dir), "roles_here.py")
    assert load_class(f"{path}:Base", key="roles.coordinator").__name__ == "Base"
