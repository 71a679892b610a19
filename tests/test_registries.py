"""The registries of training modes (training.engine.modes) and task kinds (training.tasks.kinds):
each entry resolves to real code, and every list a user sees derives from them."""

import pytest

from seqenc.baselines import MODEL_CLASSES
from seqenc.config import TASKS
from seqenc.table_model import TABLE_MODELS
from training.engine.modes import BENCH_MODES, END_TO_END, MODES, SELECTABLE, get_mode, mode_help
from training.tasks.catalog import CatalogError, parse_catalog
from training.tasks.kinds import KINDS, TASK_KINDS, get_kind

SOURCE = {"sources": {"s": {"kind": "events"}}}


@pytest.mark.parametrize("name", list(MODES))
def test_every_mode_resolves_to_its_trainer_models_and_builder(name):
    mode = MODES[name]
    assert isinstance(mode.trainer_class(), type) and mode.trainer_class().__name__ in mode.trainer
    assert set(mode.architectures) <= set(MODEL_CLASSES), mode.architectures
    if mode.end_to_end:
        assert mode.trainer_class().__name__ == "EndToEndTrainer"
        from training.engine.modes import _load

        assert callable(_load(mode.build))
    else:
        with pytest.raises(ValueError, match="S\\(k\\) windows"):
            mode.build_model(None, None, None, None)


def test_the_table_mode_holds_every_table_encoder():
    assert set(MODES["table"].architectures) == {cls.__name__ for cls in TABLE_MODELS}


def test_mode_lists_derive_from_the_registry():
    from training.bench.accuracy import MODES as bench_modes
    from training.cli.main import build_parser

    assert SELECTABLE == tuple(n for n in MODES if n != "unlabelled") and "unlabelled" in MODES
    assert set(END_TO_END) == {"joint", "flattened", "record_view", "table"}
    assert bench_modes == BENCH_MODES == ("interleaved", "no_interleave", "flattened", "record_view")
    train = next(a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
                 if "--mode" in a.option_strings)
    assert list(train.choices) == list(SELECTABLE)
    assert all(name in mode_help() for name in SELECTABLE) and "unlabelled" not in train.choices
    with pytest.raises(ValueError, match="one of interleaved, no_interleave"):
        get_mode("unlabelled")


def test_the_catalogue_checks_modes_and_kinds_against_the_registries():
    for mode in SELECTABLE:
        task = {"source": "s", "kind": "multiclass", "mode": mode}
        if mode == "table":
            continue  # needs a table_source (tests/test_table_data_safety.py)
        assert parse_catalog({**SOURCE, "tasks": {"t": task}}).task("t").mode == mode
    with pytest.raises(CatalogError, match="'unlabelled' is not allowed"):
        parse_catalog({**SOURCE, "tasks": {"t": {"source": "s", "kind": "multiclass", "mode": "unlabelled"}}})
    with pytest.raises(CatalogError, match="'ranking' is not allowed"):
        parse_catalog({**SOURCE, "tasks": {"t": {"source": "s", "kind": "ranking"}}})
    for name in TASK_KINDS:
        fields = {"binary": {"positive": "p"}, "next_item": {"item_key": "sku"}}.get(name, {})
        assert parse_catalog({**SOURCE, "tasks": {"t": {"source": "s", "kind": name, **fields}}}).task("t").kind == name


def test_every_kind_is_consistent():
    for name, kind in KINDS.items():
        assert kind.head in TASKS, name
        if kind.default_threshold is not None:
            assert kind.default_threshold["policy"] in kind.threshold_policies, name
        assert get_kind(name) is kind
    assert [n for n, k in KINDS.items() if not k.labelled] == ["anomaly"]
    assert [n for n, k in KINDS.items() if k.ranks_items] == ["next_item"]
    with pytest.raises(ValueError, match="unknown task kind 'ranking'"):
        get_kind("ranking")


def test_a_threshold_outside_the_kinds_policies_is_refused_with_what_applies():
    task = {"source": "s", "kind": "multiclass", "threshold": {"policy": "one_se"}}
    with pytest.raises(CatalogError, match="does not apply to a multiclass task .binary: best_f1"):
        parse_catalog({**SOURCE, "tasks": {"t": task}})


def test_the_docs_table_of_modes_is_the_registry():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    section = text.split("## Modes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(MODES)
