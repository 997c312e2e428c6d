"""Config schema: defaults, loading, round trips, overrides, and the exact error of each mistake."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from gflowdist.config import (
    SECTIONS,
    Config,
    ConfigError,
    FaultsConfig,
    LayoutConfig,
    ReplayConfig,
    parse_yaml,
)


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- defaults and round trips ---------------------------------------------


def test_defaults_match_the_documented_values() -> None:
    cfg = Config()
    assert (cfg.run.name, cfg.run.seed, cfg.run.steps, cfg.run.out_dir, cfg.run.log_every) == (
        "run",
        0,
        100,
        "runs",
        10,
    )
    assert (cfg.launch.engine, cfg.launch.nprocs, cfg.launch.mpiexec, cfg.launch.mpiexec_args) == ("auto", 4, None, ())
    assert (
        cfg.layout.trainers,
        cfg.layout.actors,
        cfg.layout.buffers,
        cfg.layout.coordinator,
        cfg.layout.agent_groups,
        cfg.layout.placement,
    ) == ("rest", 0, 1, True, 1, "block")
    assert cfg.replay.capacity == 10000
    assert cfg.replay.replay_fraction == 0.5 and cfg.replay.max_in_flight == 8
    assert cfg.replay.samples_per_insert is None and cfg.replay.tolerance == 0.0
    assert (cfg.sync.mode, cfg.sync.every, cfg.sync.weights_to_actors_every) == ("gradients", 1, 1)
    assert cfg.faults.max_message_bytes == 256 * 1024 * 1024
    assert cfg.faults.peer_timeout_s > cfg.faults.heartbeat_s
    assert dict(cfg.params) == {}


def test_sections_are_frozen() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.layout.buffers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.params["x"] = 1  # type: ignore[index]


FULL = """
run: {name: grid, seed: 3, steps: 50, out_dir: out, log_every: 5}
launch: {engine: mpi, nprocs: 8, mpiexec: /opt/mpi/bin/mpiexec, mpiexec_args: [--bind-to, core]}
layout: {trainers: 4, actors: rest, buffers: 2, coordinator: true, agent_groups: 2,
         placement: node-local}
roles: {trainer: my_roles.py:GridTrainer, buffer: "pkg.mod:Buf"}
replay: {capacity: 500, sampler: prioritized, writer: dedup,
         min_size_to_sample: 10, samples_per_insert: 2, tolerance: 8.5, replay_fraction: 0.25,
         max_staleness: 4, max_in_flight: 3, prefetch: 0, dedup_key: terminal}
sync: {mode: models, every: 5, weights_to_actors_every: 2}
faults: {heartbeat_s: 0.5, peer_timeout_s: 3, checkpoint_every: 20, max_message_bytes: 1024}
params: {ndim: 2, height: 8, lr: 1e-3, nested: {a: [1, 2]}}
"""


def test_full_file_loads_and_round_trips(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    cfg = Config.from_yaml(path)
    assert cfg.file == str(path)
    assert cfg.launch.mpiexec_args == ("--bind-to", "core")
    assert cfg.layout.actors == "rest" and cfg.layout.placement == "node-local"
    assert cfg.replay.samples_per_insert == 2.0 and isinstance(cfg.replay.samples_per_insert, float)
    assert cfg.faults.peer_timeout_s == 3.0 and isinstance(cfg.faults.peer_timeout_s, float)
    assert cfg.params["lr"] == pytest.approx(0.001)  # YAML 1.2 float, not the string "1e-3"
    assert cfg.params["nested"] == {"a": (1, 2)}  # read-only: lists are tuples
    again = Config.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    assert parse_yaml(__import__("yaml").safe_dump(cfg.to_dict())) == cfg.to_dict()


def test_default_round_trip_and_empty_inputs() -> None:
    assert Config.from_dict(Config().to_dict()) == Config()
    assert Config.from_dict({}) == Config()
    assert Config.from_dict(None) == Config()
    assert Config.from_dict({"layout": None}) == Config()  # "layout:" with nothing under it


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n", "{}\n"])
def test_an_empty_file_is_refused(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="the file is empty: a config needs at least the role classes") as info:
        Config.from_yaml(path)
    assert info.value.file == str(path)


def test_int_is_accepted_for_float_and_stored_as_float() -> None:
    cfg = Config.from_dict({"faults": {"heartbeat_s": 2, "peer_timeout_s": 7}})
    assert type(cfg.faults.heartbeat_s) is float and cfg.faults.heartbeat_s == 2.0


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError) as info:
        LayoutConfig(buffers=-1)
    assert info.value.key == "layout.buffers"
    with pytest.raises(ConfigError) as info:
        FaultsConfig(heartbeat_s=5.0, peer_timeout_s=5.0)
    assert info.value.key == "faults.peer_timeout_s"
    with pytest.raises(ConfigError) as info:
        Config(layout={"buffers": 2})  # type: ignore[arg-type]
    assert info.value.key == "layout"


# --- overrides -------------------------------------------------------------


def test_overrides_parse_yaml_values() -> None:
    cfg = Config().apply_overrides(
        [
            "layout.buffers=2",
            "run.seed=3",
            "params.lr=0.01",
            "layout.coordinator=false",
            "launch.mpiexec_args=[--bind-to, core]",
            "params.model.hidden=64",
            "replay.max_staleness=null",
            "layout.trainers=rest",
            "run.name=exp 1",
        ]
    )
    assert cfg.layout.buffers == 2 and cfg.run.seed == 3
    assert cfg.params["lr"] == 0.01 and cfg.params["model"] == {"hidden": 64}
    assert cfg.layout.coordinator is False
    assert cfg.launch.mpiexec_args == ("--bind-to", "core")
    assert cfg.replay.max_staleness is None
    assert cfg.run.name == "exp 1"


def test_overrides_do_not_change_the_original_and_apply_in_order() -> None:
    base = Config()
    cfg = base.apply_overrides(["run.seed=1", "run.seed=2"])
    assert cfg.run.seed == 2 and base.run.seed == 0
    assert base.apply_overrides([]) is base


def test_from_yaml_applies_overrides_and_keeps_file(tmp_path: Path) -> None:
    path = write(tmp_path, "layout: {buffers: 1}\nparams: {lr: 0.1}\n")
    cfg = Config.from_yaml(path, overrides=["layout.buffers=3", "params.lr=0.2"])
    assert cfg.layout.buffers == 3 and cfg.params["lr"] == 0.2 and cfg.file == str(path)


OVERRIDE_ERRORS = [
    ("layout.buffers", None, ["'layout.buffers' is not an override: write layout.buffers=VALUE"]),
    ("buffers=2", "buffers", ["unknown section 'buffers' (did you mean 'layout.buffers=2'?)"]),
    ("replay.batch_size=8", "replay.batch_size", ["replay.batch_size: was removed", "override 'replay.batch_size=8'"]),
    ("layout.bufers=2", "layout.bufers", ["unknown key 'bufers'", "did you mean 'buffers'"]),
    ("layot.buffers=2", "layot.buffers", ["unknown section 'layot'", "did you mean 'layout'"]),
    ("layout=2", "layout", ["unknown key", "valid keys"]),
    (
        "layout.buffers=two",
        "layout.buffers",
        ["expected an integer >= 0 or 'rest'", "str 'two'", "override 'layout.buffers=two'"],
    ),
    ("run.steps=true", "run.steps", ["expected an integer >= 1", "bool True"]),
    ("params=3", "params", ["params.<name>=value"]),
    ("faults.heartbeat_s=20", "faults.peer_timeout_s", ["greater than faults.heartbeat_s", "after overrides"]),
    ("params.lr=[1, 2", "params.lr", ["cannot parse the value"]),
    ("launch.warm_imports=[1bad]", "launch.warm_imports", ["list of module names", "'1bad' is not a module name"]),
    ("launch.warm_imports=gymnasium", "launch.warm_imports", ["found str 'gymnasium'", "e.g. [gymnasium]"]),
]


@pytest.mark.parametrize("override, key, words", OVERRIDE_ERRORS)
def test_override_errors_name_the_key(override: str, key: str | None, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Config().apply_overrides([override])
    assert info.value.key == key
    for word in words:
        assert word in str(info.value)


def test_override_inside_a_non_mapping_param_is_refused() -> None:
    cfg = Config().apply_overrides(["params.lr=0.1"])
    with pytest.raises(ConfigError, match=r"cannot set a key inside float 0.1") as info:
        cfg.apply_overrides(["params.lr.x=1"])
    assert info.value.key == "params.lr"


# --- malformed configs: the exact error of each ------------------------------

MALFORMED = [
    # (yaml text, key path, words the message must contain)
    ("layout: {bufers: 2}", "layout.bufers", ["unknown key 'bufers' (did you mean 'buffers'?)"]),
    ("layuot: {buffers: 2}", "layuot", ["unknown section 'layuot' (did you mean 'layout'?)"]),
    ("run: {stepz: 3}", "run.stepz", ["unknown key 'stepz' (did you mean 'steps'?)"]),
    ("report: {curves: eval_return}", "report.curves", ["expected a list of strings", "write a list"]),
    ("run: {steps: 0}", "run.steps", ["expected an integer >= 1", "found int 0"]),
    ("run: {steps: true}", "run.steps", ["expected an integer >= 1", "found bool True"]),
    ("run: {steps: 2.5}", "run.steps", ["expected an integer", "float 2.5"]),
    ("run: {seed: -1}", "run.seed", ["expected an integer >= 0", "int -1"]),
    ("run: {name: a/b}", "run.name", ["without '/'", "str 'a/b'"]),
    ("run: {name: ''}", "run.name", ["non-empty name"]),
    ("inference: {max_delay_ms: -1}", "inference.max_delay_ms", ["expected a finite number >= 0.0", "int -1"]),
    ("inference: {max_delay_ms: .nan}", "inference.max_delay_ms", ["expected a finite number", "float nan"]),
    ("inference: {max_batch: 0}", "inference.max_batch", ["expected an integer >= 1", "int 0"]),
    ("layout: {inference: -1}", "layout.inference", ["expected an integer >= 0", "int -1"]),
    ("inference: {split: 0}", "inference.split", ["expected an integer >= 1 and <= 16", "int 0"]),
    ("inference: {split: 17}", "inference.split", ["expected an integer >= 1 and <= 16", "int 17"]),
    (
        "layout: {inference: 1}\ninference: {split: 3}\nparams: {envs_per_actor: 16}",
        "inference.split",
        ["is 3, which does not divide params.envs_per_actor (16)", "inference.split equal groups"],
    ),
    (
        "launch: {engine: tourch}",
        "launch.engine",
        ["one of 'auto', 'mpi', 'torch'", "str 'tourch'", "did you mean 'torch'"],
    ),
    ("launch: {nprocs: 0}", "launch.nprocs", ["expected an integer >= 1", "int 0"]),
    ("launch: {nprocs: '4'}", "launch.nprocs", ["expected an integer >= 1", "str '4'"]),
    ("launch: {mpiexec_args: --bind-to core}", "launch.mpiexec_args", ["a list of strings", "write a list"]),
    ("launch: {mpiexec_args: [1, 2]}", "launch.mpiexec_args", ["a list of strings", "list [1, 2]"]),
    ("launch: {mpiexec: 3}", "launch.mpiexec", ["null or a non-empty string", "int 3"]),
    ("layout: {buffers: -1}", "layout.buffers", ["an integer >= 0 or 'rest'", "int -1"]),
    ("layout: {buffers: rst}", "layout.buffers", ["did you mean 'rest'"]),
    (
        "layout: {trainers: rest, buffers: rest}",
        "layout.buffers",
        ["at most one count may be 'rest'", "trainers and buffers"],
    ),
    ("layout: {coordinator: 1}", "layout.coordinator", ["true or false", "int 1"]),
    ("layout: {agent_groups: 0}", "layout.agent_groups", ["expected an integer >= 1", "int 0"]),
    (
        "layout: {placement: node_local}",
        "layout.placement",
        ["one of 'block', 'node-local'", "did you mean 'node-local'"],
    ),
    (
        "roles: {trainer: my_module.Trainer}",
        "roles.trainer",
        ["'package.module:Class' or 'path/to/file.py:Class'", "str 'my_module.Trainer'"],
    ),
    ("roles: {learner: a:B}", "roles.learner", ["unknown key 'learner'"]),
    ("replay: {capacity: 0}", "replay.capacity", ["expected an integer >= 1", "int 0"]),
    ("replay: {sampler: priority}", "replay.sampler", ["did you mean 'prioritized'"]),
    ("replay: {writer: roundrobin}", "replay.writer", ["did you mean 'round_robin'"]),
    ("replay: {replay_fraction: 1.5}", "replay.replay_fraction", ["a finite number >= 0.0 and < 1.0", "float 1.5"]),
    ("replay: {replay_fraction: 1}", "replay.replay_fraction", ["a finite number >= 0.0 and < 1.0", "int 1"]),
    (
        "replay: {batch_size: 16}",
        "replay.batch_size",
        ["replay.batch_size: was removed", "set replay_fraction instead"],
    ),
    ("replay: {replay_fraction: .nan}", "replay.replay_fraction", ["a finite number"]),
    ("replay: {samples_per_insert: 0}", "replay.samples_per_insert", ["null or a finite number > 0.0", "int 0"]),
    ("replay: {tolerance: 2.0}", "replay.tolerance", ["only applies when replay.samples_per_insert"]),
    (
        "replay: {samples_per_insert: 4, tolerance: 2}",
        "replay.tolerance",
        [">= max(1, samples_per_insert)", "block inserts and samples forever"],
    ),
    ("replay: {writer: dedup}", "replay.writer", ["writer 'dedup' needs its key"]),
    (
        "replay: {capacity: 10, min_size_to_sample: 11}",
        "replay.min_size_to_sample",
        ["<= replay.capacity (10)", "never start"],
    ),
    ("replay: {max_in_flight: 0}", "replay.max_in_flight", ["expected an integer >= 1"]),
    ("sync: {mode: gradient}", "sync.mode", ["did you mean 'gradients'"]),
    ("sync: {every: 0}", "sync.every", ["expected an integer >= 1"]),
    ("learner: {epochs: 0}", "learner.epochs", ["expected an integer >= 1"]),
    ("learner: {minibatches: 4, batch_size: 30}", "learner.minibatches", ["does not divide learner.batch_size 30"]),
    ("learner: {max_grad_norm: 0}", "learner.max_grad_norm", ["> 0"]),
    (
        "faults: {heartbeat_s: 2, peer_timeout_s: 1}",
        "faults.peer_timeout_s",
        ["greater than faults.heartbeat_s (2.0)", "found 1.0"],
    ),
    ("faults: {heartbeat_s: 0}", "faults.heartbeat_s", ["a finite number > 0.0"]),
    ("faults: {max_message_bytes: 0}", "faults.max_message_bytes", ["expected an integer >= 1"]),
    ("params: [1, 2]", "params", ["a mapping with string keys", "list [1, 2]"]),
    ("params: {1: a}", "params", ["string keys", "int 1"]),
    ("layout: 3", "layout", ["a mapping of settings", "int 3"]),
]


@pytest.mark.parametrize("text, key, words", MALFORMED, ids=[row[1] + ":" + row[0] for row in MALFORMED])
def test_malformed_config_gives_the_exact_error(tmp_path: Path, text: str, key: str, words: list[str]) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as info:
        Config.from_yaml(path)
    err = info.value
    assert err.key == key
    assert err.file == str(path)
    assert str(err).startswith(f"{path}: {key}: ")
    for word in words:
        assert word in str(err), f"{word!r} not in {str(err)!r}"


def test_every_section_has_a_malformed_row() -> None:
    covered = {row[1].split(".")[0] for row in MALFORMED}
    assert set(SECTIONS) | {"params"} <= covered


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections, found list") as info:
        Config.from_yaml(path)
    assert info.value.file == str(path) and info.value.key is None


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found") as info:
        Config.from_yaml(tmp_path / "nope.yaml")
    assert info.value.file == str(tmp_path / "nope.yaml")


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  steps: 3\n  name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+, column \d+") as info:
        Config.from_yaml(path)
    assert info.value.file == str(path)


def test_duplicate_key_is_an_error_not_last_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "layout:\n  buffers: 1\n  buffers: 2\n")
    with pytest.raises(ConfigError, match="line 3, column 3: duplicate key 'buffers'"):
        Config.from_yaml(path)


def test_yaml_never_builds_python_objects(tmp_path: Path) -> None:
    path = write(tmp_path, "params: {x: !!python/object/apply:os.system [echo hi]}\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        Config.from_yaml(path)


@pytest.mark.parametrize(
    "text, value",
    [("1e-3", 0.001), ("1.5E+2", 150.0), ("-2e1", -20.0), ("1_000", 1000), ("0.5", 0.5), ("rest", "rest")],
)
def test_number_forms(text: str, value: object) -> None:
    parsed = parse_yaml(f"x: {text}")["x"]
    assert parsed == value and type(parsed) is type(value)


def test_replay_rate_limit_consistent_when_both_set() -> None:
    cfg = ReplayConfig(samples_per_insert=4.0, tolerance=16.0)
    assert cfg.samples_per_insert == 4.0 and cfg.tolerance == 16.0


@pytest.mark.parametrize(
    "fraction, fresh, replayed",
    [(0.0, 16, 0), (0.2, 16, 4), (0.5, 32, 32), (0.25, 30, 10), (0.75, 8, 24), (0.2, 1, 1), (0.5, 7, 7)],
)
def test_replay_fraction_is_the_replayed_share_of_the_learner_batch(fraction, fresh, replayed):
    got = ReplayConfig(replay_fraction=fraction).replayed_per_step(fresh)
    assert got == replayed
    if fraction and fresh >= 8:  # the share of the batch the trainer learns from
        assert got / (fresh + got) == pytest.approx(fraction, abs=0.5 / (fresh + got))
