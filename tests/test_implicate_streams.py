"""gedp implicates --processes N: each implicate's priors and each block's chain from a stream of its own, so the
implicates are the same bytes for any N; without it, the one stream of before. The streams draw the same
distribution as the one stream (another sequence of the same uniforms): checked by simulation."""

import json

import numpy as np
from scipy.stats import ks_2samp
from test_implicates import digests
from typer.testing import CliRunner

from gedp.cli import app
from gedp.release import implicates as release_implicates
from gedp.release.implicates import draw_blocks, prepare

runner = CliRunner()


def serial_map(task, shared, items, tell):
    for index, item in enumerate(items):
        tell(index, task(shared, item))


def test_the_same_implicates_for_any_number_of_processes(lone_release, tmp_path, monkeypatch):
    """Blocks of 700 establishments (3 blocks, 2 workers): the bytes of --processes 1 and 2 agree; without
    --processes the one stream's (other bits); a refused count is said in words."""
    monkeypatch.setattr(release_implicates, "BLOCK_ROWS", 700)
    drawn = {}
    for name, extra in {"one": [], "p1": ["--processes", "1"], "p2": ["--processes", "2"]}.items():
        out = tmp_path / name
        result = runner.invoke(app, ["implicates", str(lone_release), "--n", "3", "--out", str(out), "--seed", "4",
                                     *extra])
        assert result.exit_code == 0, result.output
        drawn[name] = digests(out)
    assert drawn["p1"] == drawn["p2"]
    files = [name for name in drawn["one"] if name.endswith(".parquet")]
    assert len(files) == 3 and all(drawn["one"][f] != drawn["p1"][f] for f in files)
    said = {name: json.loads((tmp_path / name / "_implicates.json").read_text()) for name in drawn}
    assert "streams" not in said["one"] and said["p1"]["streams"] == said["p2"]["streams"] == "per task"
    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "2", "--out", str(tmp_path / "x"),
                                 "--processes", "0"])
    assert result.exit_code != 0 and "--processes (0) must be a whole number of at least 1" in result.output


#: Independent draws per way of drawing, statistics compared, and the family's false-failure rate (Bonferroni).
DRAWS, ALPHA = 30, 1e-3


def first_implicates(draws, streams: bool, seeds: range) -> np.ndarray:
    """Per seed, the statistics of one implicate (m = 1) of the prepared release: month-3 employment, the share
    without change from month 1 to 2, the establishments under 5 employees in month 3, the wages."""
    out = []
    for seed in seeds:
        values = np.empty((len(draws.public), 4))

        def keep(positions, drawn):
            values[positions] = drawn[0]

        draw_blocks(draws, 1, np.random.default_rng(seed), keep, serial_map if streams else None)
        out.append([values[:, 2].sum(), (values[:, 0] == values[:, 1]).mean(), (values[:, 2] < 5).sum(),
                    values[:, 3].sum()])
    return np.array(out)


def test_the_streams_draw_the_one_streams_distribution(lone_release, monkeypatch):
    """30 independent first implicates each way (one draw of the priors and an 8-sweep chain: independent given the
    fitted priors, prepared once), each statistic's two samples compared by Kolmogorov-Smirnov at 1e-3 / 4 (exact
    p-values: the family's false-failure rate at most 1e-3). Power: streams whose chain is not run (a burn-in of
    0 sweeps: the months at their answers' mean, no change) are refused. (A burn-in of one sweep is not: p =
    0.003 on month-3 employment with 40 draws each, the chain's start only a few sweep sds off on 2,000
    establishments.)"""
    draws = prepare(lone_release, np.random.default_rng(2))
    one = first_implicates(draws, False, range(100, 100 + DRAWS))
    streams = first_implicates(draws, True, range(200, 200 + DRAWS))
    p = [ks_2samp(one[:, k], streams[:, k], method="exact").pvalue for k in range(one.shape[1])]
    assert min(p) > ALPHA / len(p), p
    import gedp.postprocess.implicates as model_module

    monkeypatch.setattr(model_module, "BURN_IN", 0)
    unburnt = first_implicates(draws, True, range(300, 300 + DRAWS))
    p_wrong = [ks_2samp(one[:, k], unburnt[:, k], method="exact").pvalue for k in range(one.shape[1])]
    assert min(p_wrong) < ALPHA / len(p_wrong), p_wrong
