"""Issue 26, item 1: a 16-layer KA on a frozen MiniLM TVM trains without warm-up under DT-Fixup;
the default initialisation without warm-up stalls on the same task.

The task is ``seqenc bench depth``'s synthetic ``level`` (training.bench.depth.level_task:
tiny, seeded, one key's values separate the classes -- what is tested is the optimisation, not
the task). Each KA trains on MiniLM's cached KRs as the bench trains a cell
(training.bench.depth.train_cell: AdamW, linear decay over 40 steps, gradient clipping at 1.0,
batch 16), learning rate 1e-3, no warm-up. What was measured over seeds 0-4 (``seqenc bench
depth --tasks level --depths 16 --lr 1e-3 --steps 40 --batch-size 16 --warmup 8 --seeds
0,1,2,3,4``; docs/model.md): DT-Fixup's batch loss falls below 0.05 at step 4-5 on every seed,
the default's at step 8-12 or never (seed 0 stays at chance, ln 2), the default with 8 warm-up
steps' at 5-7. This rate is at the edge for every init (DT-Fixup spikes once after converging
on seed 1, so the test reads how fast each gets there, not the last steps: it runs the first
12 steps of the 40-step schedule). The thresholds below sit between those measured ranges; they
were set from these seeds, so this is a regression test of the measured behaviour, not a
held-out claim."""

from __future__ import annotations

import pytest

from training.bench.depth import DepthBenchSettings, task_krs, train_cell

SEEDS = (0, 1, 2)
SETTINGS = DepthBenchSettings(data_dir="", tasks=("level",), steps=40, lr=1e-3, warmup=0, batch_size=16)
EARLY = 12  # steps run of the 40-step schedule
CONVERGED = 0.05  # a batch loss this low: every sequence of the batch right with high confidence


def first_converged_step(losses: list[float]) -> int | None:
    return next((i for i, loss in enumerate(losses) if loss < CONVERGED), None)


@pytest.fixture(scope="module")
def level(tmp_path_factory):
    return task_krs("level", SETTINGS, tmp_path_factory.mktemp("depth"), progress=False)


def test_a_16_layer_ka_trains_without_warm_up_under_dt_fixup_where_the_default_init_stalls(level):
    assert (len(level.splits["train"]), len(level.splits["dev"]), len(level.splits["test"])) == (160, 40, 40)
    fixup_steps, default_steps = [], []
    for seed in SEEDS:
        fixup, fixup_losses = train_cell(level, 16, "dt_fixup", seed, SETTINGS, stop_after=EARLY)
        assert len(fixup_losses) == EARLY and fixup["fixup_mu"] > 0 and fixup_losses[0] > 0.3  # starts at chance (ln 2), scaled once
        fixup_steps.append(first_converged_step(fixup_losses))
        _, default_losses = train_cell(level, 16, "default", seed, SETTINGS, stop_after=EARLY)
        default_steps.append(first_converged_step(default_losses))
    # DT-Fixup: converged within 6 steps on every seed, without warm-up
    assert all(s is not None and s <= 6 for s in fixup_steps), fixup_steps
    # the default init without warm-up: not within 7 steps on any seed, on some not within 12 (a plateau at ln 2)
    assert all(s is None or s >= 8 for s in default_steps), default_steps
    assert None in default_steps, default_steps
