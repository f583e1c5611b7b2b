"""Randomness of releases: the secure generator by default, seeded PCG64 for experiments."""

import json

import numpy as np
import pytest
from randomgen import ChaCha
from scipy import stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.measure.mechanisms import psi_mechanism
from gedp.measure.neighbors import SqrtPsi
from gedp.measure.queries import IDENTITY, group_establishments
from gedp.measure.rng import make_rng
from gedp.synth.schema import InputError

runner = CliRunner()


def test_default_release_generator_is_chacha20_keyed_from_the_os():
    first, description = make_rng(None)
    second, _ = make_rng(None)
    assert isinstance(first.bit_generator, ChaCha) and description["kind"] == "secure"
    assert not np.array_equal(first.standard_normal(8), second.standard_normal(8))  # fresh keys


def test_seeded_generator_is_reproducible_pcg64():
    rng, description = make_rng(5)
    assert description == {"kind": "seed", "seed": 5, "bit_generator": "PCG64"}
    np.testing.assert_array_equal(rng.standard_normal(4), np.random.default_rng(5).standard_normal(4))


@pytest.mark.parametrize("seed, kind, message", [
    (3, "secure", "takes no --seed"), (None, "mersenne", "--rng 'mersenne' is unknown"), (-1, None, "must be >= 0")])
def test_contradictory_rng_requests_are_refused(seed, kind, message):
    with pytest.raises(InputError, match=message):
        make_rng(seed, kind)


def test_psi_mechanism_noise_from_chacha20_is_gaussian():
    """The secure bit generator feeds numpy's normal sampler correctly (fixed key for the test;
    KS at p < 1e-3 with power against sd x0.7 and x1.3)."""
    import pandas as pd

    n = 20_000
    values = np.random.default_rng(1).gamma(0.5, 200, size=n)
    grouping = group_establishments(pd.DataFrame({"estab_id": np.arange(n).astype(str)}), IDENTITY)
    answer = psi_mechanism(values, grouping, attribute="m1emp", psi=SqrtPsi(), gamma=0.5, mu=0.7,
                           rng=np.random.Generator(ChaCha(seed=2024, rounds=20)))
    noise = (answer.released - np.sqrt(values)) / (0.5 / 0.7)
    assert stats.kstest(noise, "norm").pvalue > 1e-3
    assert stats.kstest(noise / 0.7, "norm").pvalue < 1e-3 and stats.kstest(noise / 1.3, "norm").pvalue < 1e-3


def test_state_by_state_release_records_the_secure_generator(tmp_path, small_state):
    source = tmp_path / "in.parquet"
    small_state.to_parquet(source)
    result = runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["rng"]["kind"] == "secure" and "seed" not in manifest["rng"]
    refused = runner.invoke(
        app,
        [
            "protect",
            str(source),
            "--seed",
            "3",
            "--rng",
            "secure",
            "--not-for-publication",
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert refused.exit_code == 2 and "takes no --seed" in refused.output and not (tmp_path / "s").exists()
