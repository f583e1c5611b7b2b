"""State-by-state protection: local and dask engines agree, states compose in parallel, streaming."""

import io
import json
from pathlib import Path

import lock_probe
import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import gedp
from gedp import configs, errors
from gedp.cli import app
from gedp.running.engine import input_states, read_state
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def two_states(tmp_path_factory):
    """Two small states as a folder of Parquet parts (one per state) and as one CSV file."""
    folder = tmp_path_factory.mktemp("input")
    parts = []
    for state, seed in (("09", 1), ("44", 2)):
        frame = generate_profile(load_profile("small"), n_establishments=1_200, rng=np.random.default_rng(seed))
        frame["state"] = state
        frame["estab_id"] = state + "-" + frame["estab_id"]
        parts.append(frame)
    (folder / "states.parquet").mkdir()
    for frame in parts:
        frame.to_parquet(folder / "states.parquet" / f"part-{frame['state'].iloc[0]}.parquet", index=False)
    pd.concat(parts).to_csv(folder / "states.csv", index=False)
    parts[1].to_parquet(folder / "alone.parquet", index=False)
    return folder


def protect(source, out, *extra):
    result = runner.invoke(
        app, ["protect", str(source), "--out", str(out), "--seed", "7", "--not-for-publication", *map(str, extra)]
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / "manifest.json").read_text()), pd.read_parquet(out / "protected.parquet")


@pytest.fixture(scope="module")
def local_release(two_states, tmp_path_factory):
    """`gedp protect` of both states on the local engine (seed 7): the folder, its manifest and its
    protected microdata, read by the composition test and the dask engine's comparison (one run)."""
    out = tmp_path_factory.mktemp("local") / "both"
    return (out, *protect(two_states / "states.parquet", out))


def test_reading_one_state_at_a_time(two_states):
    assert input_states(two_states / "states.parquet")[:2] == ({"09": ["09"], "44": ["44"]}, 2_400)
    assert input_states(two_states / "states.csv")[:3] == ({"09": ["09"], "44": ["44"]}, 2_400, None)
    one = read_state(two_states / "states.parquet", "44", ("m1emp", "wage"), ["44"])
    assert len(one) == 1_200 and set(one["state"]) == {"44"}


def test_states_are_protected_separately_and_compose_in_parallel(two_states, local_release, tmp_path):
    both, manifest, protected = local_release
    assert manifest["states"] == ["09", "44"] and manifest["establishments"] == 2_400
    planned = yaml.safe_load(configs.path(configs.DEFAULT_CONFIG).read_text())
    total = np.sqrt(sum(mu * mu for q in planned["queries"] for mu in q["mu"].values()))
    assert manifest["mu_total"] == pytest.approx(total)  # parallel composition: spent once
    assert set(manifest["per_state"]) == {"09", "44"}
    # SPEC section 4: tau = Phi^-1((1 - zeta)^(1 / (kc n))) with kc attributes measured and n the
    # state's establishments, at the state's share of zeta; evaluated in 50-digit arithmetic (mpmath)
    import mpmath

    kc = len(planned["attributes"])
    for state, tau in manifest["tau"].items():
        n = int((protected["state"] == state).sum())
        with mpmath.workdps(50):
            power = mpmath.power(1 - mpmath.mpf(manifest["zeta_per_state"]), mpmath.mpf(1) / (kc * n))
            closed_form = float(mpmath.sqrt(2) * mpmath.erfinv(2 * power - 1))
        assert tau == pytest.approx(closed_form, rel=1e-9), state
    tables = pd.read_csv(both / "qcew_tables.csv", dtype={"area_fips": str})
    assert set(tables.loc[tables["agglvl_code"] == 51, "area_fips"]) == {"09000", "44000"}
    # zeta is split so that both states' bounds hold together with probability 1 - zeta
    assert (1 - manifest["zeta_per_state"]) ** 2 == pytest.approx(1 - manifest["zeta"], rel=1e-14)
    # a state's noise depends only on the seed and its code: protecting it alone gives the same
    # psi answers (the pnc answers differ only through the wider zeta share of a lone state)
    alone_manifest, _ = protect(two_states / "alone.parquet", tmp_path / "alone")
    assert alone_manifest["zeta_per_state"] == manifest["zeta"]
    psi_answers = [
        pd.read_parquet(out / "measurements.parquet")
        .query("query == 'identity' and state == '44'")
        .sort_values(["attribute", "estab_id"])["released"]
        .to_numpy()
        for out in (both, tmp_path / "alone")
    ]
    np.testing.assert_array_equal(*psi_answers)
    # CSV input: the same release
    _, from_csv = protect(two_states / "states.csv", tmp_path / "csv")
    np.testing.assert_array_equal(np.sort(from_csv["m1emp"].to_numpy()), np.sort(protected["m1emp"].to_numpy()))


@pytest.fixture(scope="module")
def dask_release(two_states, tmp_path_factory):
    """`gedp protect` of both states on the dask engine (seed 7), its built-in cluster observed once
    started: its manifest, its protected microdata and, per cluster made, its folders and what another
    local process got from it (``_tried_from_outside``). One cluster for the tests of the release and
    of the cluster's lockdown: each start costs its 2 worker processes' imports."""
    import stat

    import dask.distributed
    import distributed

    seen: list[dict] = []

    class Observed(distributed.LocalCluster):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            folder = Path(kwargs["local_directory"])
            seen.append({"folder": folder, "mode": stat.S_IMODE(folder.stat().st_mode),
                         "workers": [Path(w.local_directory) for w in self.workers.values()]})
            seen[-1]["attempts"] = _tried_from_outside(self)
            with distributed.Client(self, security=self.security) as client:
                seen[-1]["ctrl_c ignored"] = client.run(_ignores_ctrl_c)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distributed, "LocalCluster", Observed)
        patch.setattr(dask.distributed, "LocalCluster", Observed)
        manifest, protected = protect(two_states / "states.parquet", tmp_path_factory.mktemp("dask") / "both",
                                      "--engine", "dask")
    return manifest, protected, seen


def test_dask_engine_gives_the_local_release(local_release, dask_release):
    _, _, local = local_release
    manifest, distributed, _ = dask_release
    assert manifest["engine"] == "dask"
    local, distributed = (frame.sort_values("estab_id").reset_index(drop=True) for frame in (local, distributed))
    pd.testing.assert_frame_equal(local.drop(columns="wage"), distributed.drop(columns="wage"), check_exact=False,
                                  rtol=1e-12)
    # Wages are fitted from the protected employment, whose round-off differences between the
    # engines (<= 1e-11) the fit's cell-level steps amplify: known, recorded in issue 13's note.
    np.testing.assert_allclose(local["wage"], distributed["wage"], rtol=1e-6, atol=1e-3)


def _tried_from_outside(cluster) -> dict:
    """What another local process gets from a running cluster: each connection attempt's outcome
    (bounded: 5 s each) and the HTTP status of the scheduler's pages."""
    import urllib.error
    import urllib.request

    import distributed
    from distributed.security import Security

    address = cluster.scheduler_address
    attempts = {"scheduler": address, "workers": list(cluster.scheduler.workers)}
    for label, target, security in (("plain", address.replace("tls://", "tcp://"), None),
                                    ("other keys", address.replace("tcp://", "tls://"), Security.temporary())):
        try:
            with distributed.Client(target, security=security, timeout="5s") as client:
                attempts[label] = f"read {client.submit(sum, [1, 2]).result()}"
        except Exception as err:  # any refusal will do; a connection is what must not happen
            attempts[label] = type(err).__name__
    port = cluster.scheduler.http_server.port
    for page in ("/json/counts.json", "/info/main/workers.html", "/status"):
        try:
            attempts[page] = urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=5).status
        except urllib.error.HTTPError as err:
            attempts[page] = err.code
    return attempts


def test_the_local_cluster_admits_no_other_process(dask_release):
    """Before: the built-in cluster listened on unauthenticated TCP, and a plain Client of any local
    process read the input rows. Now: loopback only, TLS with keys made for the run, no HTTP pages."""
    (cluster,) = dask_release[2]
    attempts = cluster["attempts"]
    assert attempts["scheduler"].startswith("tls://127.0.0.1:"), attempts
    assert len(attempts["workers"]) == 2 and all(w.startswith("tls://127.0.0.1:") for w in attempts["workers"])
    assert not attempts["plain"].startswith("read") and not attempts["other keys"].startswith("read"), attempts
    assert [attempts[page] for page in ("/json/counts.json", "/info/main/workers.html", "/status")] == [404] * 3


def _ignores_ctrl_c() -> bool:
    import signal

    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_the_local_clusters_workers_ignore_ctrl_c(dask_release):
    """Ctrl-C reaches the whole process group: a worker that raised KeyboardInterrupt printed its
    traceback after the command's one line (red team rt25 F4). Its workers ignore it, as the local
    engine's do; the command stops the cluster. Power: before, both workers held Python's handler."""
    (cluster,) = dask_release[2]
    assert len(cluster["ctrl_c ignored"]) == 2 and all(cluster["ctrl_c ignored"].values()), cluster["ctrl_c ignored"]


def test_the_local_cluster_spills_into_a_private_folder(dask_release):
    """Before: the workers kept their files (spilled input rows) in dask-scratch-space of the temporary
    folder, created readable by every user. Now: in a folder of mode 0700, removed after the run."""
    (used,) = dask_release[2]
    assert used["mode"] & 0o077 == 0, oct(used["mode"])
    assert used["workers"] and all(used["folder"] in w.parents for w in used["workers"]), used
    assert not used["folder"].exists()


@pytest.mark.parametrize("extra, message", [
    (["--scheduler", "tcp://127.0.0.1:8786"], "scheduler 'tcp://127.0.0.1:8786' must be a tls:// address"),
    (["--scheduler", "tls://127.0.0.1:8786"], "scheduler 'tls://127.0.0.1:8786' needs TLS credentials"),
    (["--scheduler", "tls://127.0.0.1:8786", "--tls-ca-file", "ca.pem"], "need both --tls-ca-file and --tls-cert"),
    (["--scheduler", "tls://127.0.0.1:8786", "--tls-ca-file", "ca.pem", "--tls-cert", "cert.pem"],
     "--tls-ca-file 'ca.pem' is not a file"),
    (["--insecure-scheduler"], "go with --scheduler"),
    (["--engine", "local", "--scheduler", "tcp://127.0.0.1:8786", "--insecure-scheduler"],
     "goes with --engine dask, not 'local'"),
])
def test_a_scheduler_without_tls_is_refused(two_states, tmp_path, monkeypatch, extra, message):
    """Before: --scheduler tcp://HOST:8786 was accepted; the workers it serves read the confidential input."""
    monkeypatch.chdir(tmp_path)
    arguments = ["protect", str(two_states / "alone.parquet"), "--out", str(tmp_path / "out")]
    engine = [] if "--engine" in extra else ["--engine", "dask"]
    result = runner.invoke(app, [*arguments, *engine, *extra])
    assert result.exit_code == 2 and message in result.output.splitlines()[-1], result.output
    assert not (tmp_path / "out").exists()


def test_an_insecure_scheduler_is_accepted_with_a_warning(capsys):
    from gedp.running.engine import Scheduler, scheduler_access

    assert scheduler_access("tcp://10.0.0.1:8786", insecure=True) == Scheduler("tcp://10.0.0.1:8786", None, True)
    warning = capsys.readouterr().err
    assert warning.startswith("warning: --insecure-scheduler") and "tcp://10.0.0.1:8786" in warning
    with pytest.raises(errors.InputError, match="must be a tls:// address"):
        gedp.protect(pd.DataFrame(), engine=gedp.Engine("dask", scheduler="tcp://10.0.0.1:8786"))


@pytest.fixture(scope="module")
def two_job_states(two_states):
    """The two states' job table (synthetic, one file for both), next to their Parquet parts."""
    from gedp.synth.jobs import synthesize_jobs

    frames = [pd.read_parquet(part) for part in sorted((two_states / "states.parquet").iterdir())]
    tables = [synthesize_jobs(frame, rng=np.random.default_rng(20 + k)) for k, frame in enumerate(frames)]
    pd.concat(tables, ignore_index=True).to_parquet(two_states / "jobs.parquet", index=False)
    return two_states / "states.parquet", two_states / "jobs.parquet"


def released_files(folder):
    """Every file of a release, by its path inside the release, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_dask_engine_gives_the_local_job_frame_release_byte_for_byte(two_job_states, tmp_path):
    """A two-state job-frame release (--jobs, --config jobs) on the dask engine: every file is the
    local engine's byte for byte (README "Machine dependence": one BLAS thread, so the engines
    agree exactly; this plan has no wages, the one documented difference) and the manifest differs
    only in its engine; job tabulations with margins work on it. Power: another seed changes the
    job frame's bytes. (A false failure needs the two runs to straddle midnight UTC: the manifest's
    date.)"""
    states, jobs = two_job_states
    releases = {}
    for engine, seed in (("local", 7), ("dask", 7), ("local", 8)):
        out = tmp_path / f"{engine}-{seed}"
        result = runner.invoke(app, ["protect", str(states), "--jobs", str(jobs), "--config", "jobs", "--out",
                                     str(out), "--seed", str(seed), "--not-for-publication", "--engine", engine])
        assert result.exit_code == 0, result.output
        releases[engine, seed] = out
    local, distributed = (released_files(releases[engine, 7]) for engine in ("local", "dask"))
    assert set(local) == set(distributed)
    assert {"protected_jobs.parquet/part-09.parquet", "protected_jobs.parquet/part-44.parquet",
            "protected.parquet/part-44.parquet", "measurements.parquet/part-09.parquet", "qcew_tables.csv"} < set(local)
    for name in local:
        if name != "manifest.json":
            assert local[name] == distributed[name], name
    manifests = [json.loads(files.pop("manifest.json")) for files in (local, distributed)]
    assert [m.pop("engine") for m in manifests] == ["local", "dask"]
    assert manifests[0] == manifests[1]
    assert manifests[0]["jobs"]["families"]["worker"]["categories"] == {"09": 10, "44": 10}
    other = released_files(releases["local", 8])
    assert other["protected_jobs.parquet/part-44.parquet"] != local["protected_jobs.parquet/part-44.parquet"]
    # job tabulations with margins of error on the dask release: the local release's, and summed
    # over sex the establishments' protected employment by county
    tables = []
    for engine in ("local", "dask"):
        result = runner.invoke(app, ["tabulate", str(releases[engine, 7]), "--by", "county,sex", "--moe"])
        assert result.exit_code == 0, result.output
        tables.append(result.stdout)
    assert tables[0] == tables[1]
    by_sex = pd.read_csv(io.StringIO(tables[1]), dtype={"state": str, "county": str, "sex": str})
    assert list(by_sex.columns) == ["state", "county", "sex", "estabs", "jobs", "jobs_moe"]
    assert set(by_sex["state"]) == {"09", "44"} and set(by_sex["sex"]) == {"1", "2"}
    assert (by_sex["jobs_moe"] > 0).all()
    employment = pd.read_parquet(releases["dask", 7] / "protected.parquet").groupby(["state", "county"])["m1emp"].sum()
    summed = by_sex.groupby(["state", "county"])["jobs"].sum()
    np.testing.assert_allclose(summed.to_numpy(), employment.reindex(summed.index).to_numpy(), rtol=1e-9)
    assert len(summed) == len(employment)


@pytest.mark.slow
def test_dask_engine_protects_job_frames_held_in_memory(two_job_states, tmp_path):
    """The Python API with DataFrames (both states' establishments and jobs) on the dask engine: the
    tables reach the workers as scattered data, and the release is the local engine's."""
    import gedp

    states, jobs = (pd.read_parquet(path) for path in two_job_states)
    files = []
    for engine in ("local", "dask"):
        release = gedp.protect(states, "jobs", input=gedp.Input(jobs=jobs), seed=7, not_for_publication=True,
                                   engine=gedp.Engine(engine))
        release.write(tmp_path / engine)
        files.append(released_files(tmp_path / engine))
    manifests = [json.loads(f.pop("manifest.json")) for f in files]
    assert files[0] == files[1]
    assert [m.pop("engine") for m in manifests] == ["local", "dask"] and manifests[0] == manifests[1]


def test_queries_spanning_states_are_refused(two_states, tmp_path):
    raw = yaml.safe_load(configs.path("employment").read_text())
    raw["queries"].append({"by": "total", "mu": {"m1emp": 0.1}})
    raw["mu_cap"] = 5
    config = tmp_path / "national.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["protect", str(two_states / "states.parquet"), "--config", str(config),
                                 "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "query total spans states" in result.output
    assert not (tmp_path / "r").exists()
    bad_engine = runner.invoke(app, ["protect", str(two_states / "alone.parquet"), "--engine", "spark",
                                     "--out", str(tmp_path / "s")])
    assert bad_engine.exit_code == 2 and "engine 'spark' is unknown" in bad_engine.output


def test_a_state_that_fails_to_write_stops_the_release(two_states, tmp_path, monkeypatch):
    """In one process, states are written while the next one is protected: a failed write of the first state is
    raised (not lost in the writing thread), the second state is not reported done, nothing is
    published and the staging folder is removed."""
    import gedp.release.writer
    import gedp.running.engine
    from gedp.config import load_config

    write_measurements, done = gedp.release.writer.write_measurements, []

    def failing(measurements, path, key):  # runs on the state's writing thread
        if path.name == "part-09.parquet":
            raise OSError("disk full")
        write_measurements(measurements, path, key)

    monkeypatch.setattr(gedp.release.writer, "write_measurements", failing)
    with pytest.raises(OSError, match="disk full"):
        gedp.running.engine.protect_input(two_states / "states.parquet", load_config("baseline"), tmp_path / "out",
                                          seed=1, on_state=done.append, processes=1)
    assert done == []
    assert list(tmp_path.iterdir()) == []


#: An in-process dask client's task awaited through ``each_done`` or (argv[1] "bare", the power arm)
#: through ``as_completed`` as ``_run_on_dask`` used it before; a Ctrl-C raised at the k-th point the
#: main thread can act on one (a Python function's start or a C function's return: where the
#: interpreter runs signal handlers), for every k in turn until a round ends before it, each round then
#: asking the client's event loop to run a callback. Prints how many rounds were stopped and whether one
#: was harmed (the loop stopped answering, or the stop came out as another error): the sweep ends there.
DASK_LOOP_PROBE = """
import os, sys, threading, time
from distributed import Client, as_completed
import gedp.running.engine as engine
from lock_probe import stop_at

engine.STOP_POLL = 0.01


def nap(x):
    time.sleep(0.02)
    return x


def answers(client):
    ran = threading.Event()
    client.loop.add_callback(ran.set)
    return ran.wait(10)


if __name__ == "__main__":
    waiting = as_completed if sys.argv[1] == "bare" else engine.each_done
    client = Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    stops = k = ended = 0
    harmed = False
    while ended < 3 and k < 2000 and not harmed:
        k += 1
        futures = [client.submit(nap, k, pure=False)]
        try:
            sys.setprofile(stop_at(k))
            for _ in waiting(futures):
                pass
            ended += 1
        except KeyboardInterrupt:
            stops += 1
            ended = 0
        except Exception:
            harmed = True
        finally:
            sys.setprofile(None)
        harmed = harmed or not answers(client)
    print(stops, int(harmed), flush=True)
    os._exit(0)  # a blocked client is not closed
"""


@pytest.mark.timeout(300)
def test_a_ctrl_c_while_awaiting_the_dask_states_leaves_the_client_running():
    """``_run_on_dask`` awaited the states through dask's ``as_completed``, which takes its own locks over
    and over while it waits; a Ctrl-C raised just after it took one left it taken (the client's event loop
    then blocks on it as the state's task ends, and so does the client's close: a stopped `gedp protect
    --engine dask` that never ends), or came out as a RuntimeError. ``each_done`` looks at
    ``Future.done``, which takes no lock. A Ctrl-C at every point where the interpreter acts on one, in
    turn (no chance involved): the bare wait was harmed at one of them (power), ``each_done`` at none. The
    bare wait's harm can also kill the probe's process (a segmentation fault after the interrupted wait, 1
    run in 6 here; never in 10 runs of ``each_done``): that is harm shown too."""
    status, numbers, stderr = lock_probe.outcome(DASK_LOOP_PROBE, "bare", timeout=280)
    assert status < 0 or (status == 0 and numbers[0] > 0 and numbers[1] == 1), (status, stderr)  # power
    stops, harmed = lock_probe.run(DASK_LOOP_PROBE, "guarded", timeout=280)
    assert stops > 10 and harmed == 0
