"""One source for every setting: TrainConfig's fields make the command line, the profiles and the checks."""

import typing
from dataclasses import fields

import pytest

from ddp_core.engine.config import (
    PROFILES_DIR,
    TrainConfig,
    UsageError,
    build_parser,
    load_profile,
    parse_args,
    to_args,
)
from ddp_core.engine.model_shape import PRESETS


def test_every_setting_has_an_option_with_its_default_and_meaning():
    parser = build_parser()
    by_dest = {action.dest: action for action in parser._actions}
    for f in fields(TrainConfig):
        action = by_dest[f.name]
        assert f.metadata["help"] in action.help
        if not isinstance(f.default, bool) and not f.metadata["env"]:
            assert action.default == f.default


def test_the_presets_a_setting_allows_are_the_models_presets():
    assert typing.get_args(typing.get_type_hints(TrainConfig)["preset"]) == tuple(PRESETS)


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES_DIR.glob("*.yml")))
def test_every_profile_becomes_the_config_it_names(profile):
    settings = load_profile(profile)
    cfg = parse_args(to_args(settings), world_size=1)
    assert {name: getattr(cfg, name) for name in settings} == settings


def test_a_profile_with_a_misspelt_setting_is_refused(tmp_path):
    path = tmp_path / "mine.yml"
    path.write_text("dataset: synthetic\nlearning_rate: 0.1\n")
    with pytest.raises(UsageError, match="unknown setting 'learning_rate'"):
        load_profile(path)


def test_an_unknown_profile_names_the_ones_there_are():
    with pytest.raises(UsageError, match="no profile 'huge'.*the profiles are: default, gpu, tiny"):
        load_profile("huge")


def test_switches_round_trip_through_the_command_line():
    cfg = parse_args(to_args({"timers": False, "progress": False, "global_batch_size": 8}), world_size=1)
    assert (cfg.timers, cfg.progress, cfg.check) == (False, False, False)


def test_a_run_saved_before_a_setting_existed_had_that_settings_default():
    from ddp_core.engine.config import differing_settings

    cfg = parse_args(["--global-batch-size", "8"], world_size=1)
    saved = {k: v for k, v in cfg.to_dict().items() if k not in ("comm_hook", "bucket_cap_mb", "powersgd_rank")}
    assert differing_settings(saved, cfg) == []
    assert differing_settings(saved | {"lr": 1.0}, cfg) == ["--lr"]
