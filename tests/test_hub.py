"""Hub ids (`ORG/NAME` at a revision) against a real, offline Hugging Face cache.

The cache is the layout huggingface_hub writes (tests/hf_cache.py), built from the demo model;
the Hub's network is the one thing that cannot exist here: its error answers come from a tiny
local HTTP server standing in for it (`HF_ENDPOINT`).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from helpers import (
    REPO_ROOT,
    base_flags,
    launcher_command,
    run_cli,
    subprocess_env,
    train_in_process,
)
from hf_cache import HubRepo, build_hub_cache, model_files

from mini_trainer.errors import UserError
from mini_trainer.models.hub import hub_source, resolve_model

REPO_ID = "demo-org/tiny-llama"


def use_offline_cache(monkeypatch, repo: HubRepo) -> HubRepo:
    """`repo`'s Hub cache, offline, for resolution in this process."""
    for name, value in repo.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return repo


@pytest.fixture
def offline_home(monkeypatch, hub_repo):
    """The session's Hub cache, offline, for in-process resolution."""
    return use_offline_cache(monkeypatch, hub_repo)


def _error(call) -> str:
    with pytest.raises(UserError) as caught:
        call()
    assert len(caught.value.lines) == 1 and caught.value.exit_code == 2
    return caught.value.lines[0]


def test_hub_id_resolves_to_the_snapshot_of_main(offline_home):
    commit = (offline_home.folder / "refs" / "main").read_text()
    resolved = resolve_model(REPO_ID)
    assert resolved.folder == offline_home.folder / "snapshots" / commit
    assert (resolved.commit, resolved.hub_id, resolved.revision) == (commit, REPO_ID, "main")
    assert hub_source(resolved.folder) == {"hub_id": REPO_ID, "commit": commit}
    assert resolve_model(REPO_ID, commit).folder == resolved.folder  # pinned to the commit


def test_local_folder_wins_over_a_hub_id(offline_home, demo_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(demo_model, tmp_path / REPO_ID)
    resolved = resolve_model(REPO_ID)
    assert resolved.folder == Path(REPO_ID) and resolved.commit is None
    assert hub_source(demo_model) is None


@pytest.mark.parametrize("name", ["no-slash", "org/na--me", "org/", "org/name.."])
def test_malformed_id_is_one_line(offline_home, name):
    assert _error(lambda: resolve_model(name)) == (
        f"{name}: --model: no such model folder, and not a Hugging Face Hub id (ORG/NAME)"
    )


@pytest.mark.parametrize("name", ["a/b/c", "../escape", "/no/such/folder"])
def test_a_missing_path_is_a_missing_folder(offline_home, name):
    assert _error(lambda: resolve_model(name)) == f"{name}: --model: no such model folder"


def test_offline_without_a_cached_copy_names_the_cache_and_the_fill_command(offline_home):
    line = _error(lambda: resolve_model("demo-org/absent", "v1"))
    cache = offline_home.hf_home / "hub" / "models--demo-org--absent"
    assert f"no cached copy in {cache}" in line and "offline (HF_HUB_OFFLINE)" in line
    assert "mini-trainer resolve-model --model demo-org/absent --model-revision v1" in line
    assert "no cached copy" in _error(lambda: resolve_model(REPO_ID, "no-such-branch"))


def test_an_empty_revision_is_refused_not_taken_as_main(offline_home, tmp_path):
    expected = (
        "--model-revision: empty (''); name a branch, tag or commit, or leave the flag out for main"
    )
    assert _error(lambda: resolve_model(REPO_ID, "")) == expected
    result = run_cli("resolve-model", "--model", REPO_ID, "--model-revision", "",
                     "--out", tmp_path / "m.json")  # fmt: skip
    assert result.returncode == 2 and result.stderr.splitlines() == [f"error: {expected}"]
    assert not (tmp_path / "m.json").exists()


def test_a_ref_naming_a_missing_snapshot_says_so(demo_model, tmp_path, monkeypatch):
    repo = use_offline_cache(monkeypatch, build_hub_cache(demo_model, tmp_path))
    missing = "0" * 40
    repo.set_ref("main", missing)
    line = _error(lambda: resolve_model(REPO_ID))
    assert f"refs/main names commit {missing}, which has no snapshot in the cache" in line, line
    assert "no cached copy" not in line
    assert "mini-trainer resolve-model --model demo-org/tiny-llama --model-revision main" in line


def test_a_resume_after_main_moved_is_refused_before_anything_is_fetched(
    demo_model, demo_dir, tmp_path, monkeypatch
):
    """The new commit of `main` has no snapshot in the (offline) cache: resolving it would fail
    ("no cached copy"). The resume is refused with the moved-branch line instead, so nothing
    of the new commit was fetched: the commit is looked up (refs/, one Hub call online) and
    compared with the run's record first."""
    from mini_trainer.models.hub import decide_commit

    repo = use_offline_cache(monkeypatch, build_hub_cache(demo_model, tmp_path / "hf"))
    first = (repo.folder / "refs" / "main").read_text()
    out = tmp_path / "run"
    out.mkdir()
    record = {"model_name_or_path": str(repo.folder / "snapshots" / first),
              "model_revision": first}  # fmt: skip
    (out / "training_args.json").write_text(json.dumps(record))
    assert decide_commit(REPO_ID, "main", out) == first  # not moved: the recorded commit
    moved = "0" * 40
    repo.set_ref("main", moved)
    expected = (f"--model-revision: the state started from {REPO_ID} commit {first}, this run "
                f"resolved {REPO_ID} to commit {moved} (the Hub's branch moved?); to continue "
                f"the run, pin it: --model-revision {first}")  # fmt: skip
    assert _error(lambda: decide_commit(REPO_ID, "main", out)) == expected
    assert decide_commit(REPO_ID, first, out) == first  # pinned: continues
    flags = base_flags(demo_dir, out, **{"model-name-or-path": REPO_ID, "resume": True})
    refused = train_in_process(*flags)
    assert refused.returncode == 2
    assert [line for line in refused.stderr.splitlines() if "error" in line] == [
        f"error: {expected}"
    ], refused.stderr


def test_srun_launch_decides_the_commit_once_for_every_node(offline_home, demo_dir, tmp_path):
    """Before srun starts one launcher per node, `launch` replaces the branch by the commit it
    names now, so a `main` that moves between the nodes' starts cannot split the job."""
    commit = (offline_home.folder / "refs" / "main").read_text()
    env = {**offline_home.env(), "SLURM_JOB_ID": "77", "SLURM_NTASKS": "2",
           "SLURM_JOB_NODELIST": "n[1-2]"}  # fmt: skip
    clean = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "HF_"))}
    flags = base_flags(demo_dir, tmp_path / "run", **{"model-name-or-path": REPO_ID})
    result = subprocess.run(
        [sys.executable, "-m", "mini_trainer", "launch", "--nproc-per-node", "1", "--dry-run",
         "--", *map(str, flags)],
        capture_output=True, text=True, env={**clean, **env}, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("srun ") and f"--model-revision {commit}" in result.stdout


def _agree_on_rank(rank: int, init_file: str, hf_home: str, folders: list, out: str) -> None:
    """One rank of `test_every_rank_trains_from_rank_0s_commit` (spawned)."""
    import torch
    import torch.distributed as dist

    from mini_trainer.distributed.runtime import Runtime
    from mini_trainer.train import agree_on_model
    from mini_trainer.training_args import TrainingArgs

    os.environ.update(HF_HOME=hf_home, HF_HUB_OFFLINE="1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    args = TrainingArgs(
        model_name_or_path=folders[rank],
        data_path="d",
        output_dir="o",
        model_revision=Path(folders[rank]).name,
    )  # as the launcher pinned it
    try:
        agreed = agree_on_model(args, Runtime(rank, rank, 2, torch.device("cpu")))
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}").write_text(f"{agreed.model_name_or_path} {agreed.model_revision}")


@pytest.mark.slow
def test_every_rank_trains_from_rank_0s_commit(demo_model, tmp_path):
    """Two nodes' launchers resolved `main` at different moments (it moved in between): rank 1
    holds the newer commit's folder, and takes rank 0's commit once the process group starts."""
    import torch.multiprocessing as mp

    repo = build_hub_cache(demo_model, tmp_path / "hf")
    first = (repo.folder / "refs" / "main").read_text()
    files = model_files(demo_model)
    files["README.md"] = b"a new commit on main\n"
    second = repo.add_snapshot(files)
    folders = [str(repo.folder / "snapshots" / commit) for commit in (first, second)]
    mp.spawn(_agree_on_rank, args=(str(tmp_path / "init"), str(repo.hf_home), folders,
                                   str(tmp_path)), nprocs=2)  # fmt: skip
    answers = {Path(tmp_path, f"rank{rank}").read_text() for rank in (0, 1)}
    assert answers == {f"{folders[0]} {first}"}


def test_repository_without_safetensors_is_refused(demo_model, tmp_path, monkeypatch):
    repo = HubRepo(tmp_path, "demo-org/pickled")
    files = {name: data for name, data in model_files(demo_model).items()
             if not name.endswith(".safetensors")}  # fmt: skip
    repo.add_snapshot({**files, "pytorch_model.bin": b"not loaded"})
    for name, value in repo.env().items():
        monkeypatch.setenv(name, value)
    line = _error(lambda: resolve_model(repo.repo_id))
    assert "no safetensors weights (it has pytorch_model.bin)" in line
    assert "pickled weights are never loaded" in line


def test_interrupted_download_is_never_a_model(demo_model, tmp_path, monkeypatch):
    """The weights link is missing (its blob still `.incomplete`), with and without the cached
    tree listing: either huggingface_hub or our own check refuses the snapshot."""
    for keep_tree in (True, False):
        repo = build_hub_cache(demo_model, tmp_path / str(keep_tree))
        commit = (repo.folder / "refs" / "main").read_text()
        link = repo.folder / "snapshots" / commit / "model.safetensors"
        blob = link.resolve()
        link.unlink()
        blob.rename(blob.with_name(blob.name + ".incomplete"))
        if not keep_tree:
            (repo.folder / "trees" / f"{commit}.json").unlink()
        for name, value in repo.env().items():
            monkeypatch.setenv(name, value)
        line = _error(lambda: resolve_model(REPO_ID))
        assert "incomplete" in line or "no safetensors weights in the cached snapshot" in line
        assert "mini-trainer resolve-model" in line


def test_sharded_snapshot_missing_a_shard_is_incomplete(demo_model, tmp_path, monkeypatch):
    repo = HubRepo(tmp_path, REPO_ID)
    files = model_files(demo_model)
    weights = files.pop("model.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    files["model-00001-of-00002.safetensors"] = weights
    commit = repo.add_snapshot(files)
    (repo.folder / "trees" / f"{commit}.json").unlink()  # as an older huggingface_hub leaves it
    for name, value in repo.env().items():
        monkeypatch.setenv(name, value)
    line = _error(lambda: resolve_model(REPO_ID))
    assert "is incomplete (missing model-00002-of-00002.safetensors" in line


# ------------------------------------------------------------------ the Hub's answers, locally


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hub answers an unknown, gated or revision-less repo."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if "/gated" in self.path:
            status, code = 403, "GatedRepo"
        elif "/revision/nope" in self.path:
            status, code = 404, "RevisionNotFound"
        else:
            status, code = 404, "RepoNotFound"
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub(tmp_path):
    """Environment for a child process whose Hub is the local server (huggingface_hub reads
    HF_HUB_OFFLINE once, at import: the test process may have imported it offline)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = subprocess_env(HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
                         HF_HOME=str(tmp_path), HF_HUB_DISABLE_IMPLICIT_TOKEN="1")  # fmt: skip
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        env.pop(name, None)
    yield env
    server.shutdown()


@pytest.mark.parametrize(
    "model, revision, expected",
    [
        (
            "demo-org/unknown",
            "main",
            "no such repository on the Hugging Face Hub, or it is private",
        ),
        ("demo-org/gated", "main", "gated repository: log in with `hf auth login` or set HF_TOKEN"),
        ("demo-org/model", "nope", "demo-org/model: no revision 'nope'"),
    ],
)
def test_hub_errors_are_one_line_each(fake_hub, model, revision, expected, tmp_path):
    result = run_cli("resolve-model", "--model", model, "--model-revision", revision,
                     "--out", tmp_path / "m.json", env=fake_hub, timeout=120)  # fmt: skip
    assert result.returncode == 2 and expected in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "m.json").exists()


def test_a_local_folder_without_config_is_no_model(tmp_path):
    """Refused where it is resolved (every command's --model), not left to the first reader:
    resolve-model used to record such a folder, and osft-svd to fail inside transformers."""
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for command in (["resolve-model", "--out", tmp_path / "m.json"],
                    ["osft-svd", "--out", tmp_path / "svd"]):  # fmt: skip
        result = run_cli(command[0], "--model", folder, *command[1:])
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"error: {folder}: --model: no config.json (expected a Hugging Face model folder)"
        ]
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "svd").exists()


# ------------------------------------------------------------------ commands, end to end


def test_validate_takes_a_hub_id_and_refuses_an_uncached_one(offline_home, demo_dir, tmp_path):
    data = demo_dir / "data" / "sort_plus1.train.jsonl"
    run_cli("validate", data, "--model", REPO_ID, "--max-tokens-per-gpu", 512,
            "--out-index", tmp_path / "i.parquet", "--out-summary", tmp_path / "s.json",
            check=True)  # fmt: skip
    summary = json.loads((tmp_path / "s.json").read_text())
    commit = (offline_home.folder / "refs" / "main").read_text()
    assert (summary["model"], summary["model_commit"]) == (REPO_ID, commit)
    bad = run_cli("validate", data, "--model", "demo-org/absent", "--max-tokens-per-gpu", 512,
                  "--out-index", tmp_path / "j.parquet",
                  "--out-summary", tmp_path / "t.json")  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no cached copy" in bad.stderr
    assert not (tmp_path / "j.parquet").exists()


def test_resolve_model_command_writes_the_record(offline_home, tmp_path):
    out = tmp_path / "model.json"
    run_cli("resolve-model", "--model", REPO_ID, "--out", out, check=True)
    record = json.loads(out.read_text())
    commit = (offline_home.folder / "refs" / "main").read_text()
    assert record["commit"] == commit and record["hub_id"] == REPO_ID
    assert Path(record["folder"]).name == commit


@pytest.mark.slow
def test_train_evaluate_and_resume_after_main_moved(demo_model, demo_dir, tmp_path, monkeypatch):
    """The launcher trains from `ORG/NAME` offline (one rank; two ranks of a node resolving
    once: test_once_per_node_rank1_waits_for_local_rank0); the commit is recorded; evaluate
    records it; after `main` moves, --resume is refused naming both commits, and pinning the
    old commit continues the run. After the launch, everything runs in this process (a world
    of one), against the same cache."""
    repo = build_hub_cache(demo_model, tmp_path / "hf_home")
    first = (repo.folder / "refs" / "main").read_text()
    env = subprocess_env(**repo.env())
    out = tmp_path / "run"
    flags = base_flags(demo_dir, out, **{
        "model-name-or-path": REPO_ID, "training-mode": "step", "max-steps": 2,
        "save-every-steps": 2, "save-final-checkpoint": True,
    })  # fmt: skip

    result = subprocess.run(launcher_command(*flags, nproc=1), capture_output=True, text=True,
                            env=env, cwd=REPO_ROOT, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    args = json.loads((out / "training_args.json").read_text())
    assert args["model_revision"] == first
    assert hub_source(args["model_name_or_path"]) == {"hub_id": REPO_ID, "commit": first}
    exported = json.loads((out / "final" / "training_args.json").read_text())
    assert exported["model_revision"] == first

    use_offline_cache(monkeypatch, repo)
    data, written = demo_dir / "data" / "sort_plus1.eval.jsonl", tmp_path / "e.json"
    evaluated = run_cli("evaluate", "--model", REPO_ID, "--data", data, "--out", written)
    assert evaluated.returncode == 0, evaluated.stderr
    record = json.loads(written.read_text())
    assert (record["model_hub_id"], record["model_commit"]) == (REPO_ID, first)

    files = model_files(demo_model)
    files["README.md"] = b"a new commit on main\n"
    second = repo.add_snapshot(files)  # refs/main now points at it
    refused = train_in_process(*flags, "--resume")
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert f"commit {first}" in refused.stderr and f"commit {second}" in refused.stderr
    assert f"--model-revision {first}" in refused.stderr
    pinned = train_in_process(*flags, "--resume", "--model-revision", first)
    assert pinned.returncode == 0, pinned.stderr[-4000:]
    assert f"resumed from {out / 'state' / 'step_2'}" in pinned.stderr


def test_once_per_node_rank1_waits_for_local_rank0(offline_home, tmp_path):
    """Local rank 1 starts first and waits; local rank 0 resolves; both get the same folder."""
    code = ("import sys; from mini_trainer.models.hub import resolve_once_per_node as r; "
            "print(r(sys.argv[1]).folder)")  # fmt: skip
    # A run id of its own: an answer file left in /tmp by an earlier session is never this one's.
    env = subprocess_env(LOCAL_WORLD_SIZE="2", TORCHELASTIC_RUN_ID=uuid.uuid4().hex)
    env.update(offline_home.env())

    def start(rank):
        return subprocess.Popen([sys.executable, "-c", code, REPO_ID],
                                env={**env, "LOCAL_RANK": rank},
                                stdout=subprocess.PIPE, text=True)  # fmt: skip

    waiting = start("1")
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(timeout=3)  # nobody has answered yet
    leader = start("0")
    outputs = [process.communicate(timeout=120)[0].strip() for process in (leader, waiting)]
    assert (
        outputs[0] == outputs[1]
        and Path(outputs[0]).name == (offline_home.folder / "refs" / "main").read_text()
    )


def test_answer_file_names_the_launcher_by_pid_and_start_time():
    """The same pid reused by a later launcher (CI: pytest-worker pids repeat across runs on a
    long-lived /tmp) must not find the earlier launcher's answer: the key holds its start time."""
    from mini_trainer.models.hub import _start_time

    ours, init = _start_time(os.getpid()), _start_time(1)
    assert ours.isdigit() and init.isdigit() and int(ours) > int(init)
    assert _start_time(2**22 + 1) == ""  # above Linux's pid_max: no such process


def test_report_provenance_names_hub_models_and_commits(tmp_path):
    from types import SimpleNamespace

    from mini_trainer.report.sections import provenance_section

    commit = "a" * 40
    snapshot = tmp_path / "hub" / "models--demo-org--tiny-llama" / "snapshots" / commit
    run = SimpleNamespace(label="sft lr 0.01", args={"model_name_or_path": str(snapshot)})
    scored = SimpleNamespace(data={"model": "m", "model_hub_id": REPO_ID, "model_commit": commit})
    _, _, html = provenance_section([run], {"e": scored}, [])
    assert "Hub models and their commits" in html
    assert html.count(commit) >= 2 and REPO_ID in html
    _, _, plain = provenance_section([SimpleNamespace(label="x", args={})], {}, [])
    assert "Hub models" not in plain


def test_fingerprint_names_both_commits_and_the_pin(demo_model, tmp_path):
    from mini_trainer.training.fingerprint import differences, model_fingerprint

    repo = build_hub_cache(demo_model, tmp_path)
    first = (repo.folder / "refs" / "main").read_text()
    second = repo.add_snapshot({**model_files(demo_model), "README.md": b"moved\n"})
    snapshots = repo.folder / "snapshots"
    run = {"options": {}, "data": {"samples": 1}}
    saved = {**run, "model": model_fingerprint(snapshots / first)}
    moved = {**run, "model": model_fingerprint(snapshots / second)}
    assert differences(saved, moved) == [
        f"--model-revision: the state started from {REPO_ID} commit {first}, this run resolved "
        f"{REPO_ID} to commit {second} (the Hub's branch moved?); to continue the run, pin it: "
        f"--model-revision {first}"
    ]
    local = {**run, "model": model_fingerprint(demo_model)}  # the same weights, as a folder
    assert differences(saved, local) == [] and differences(local, saved) == []


def test_launcher_refuses_an_uncached_hub_id_before_any_worker(hub_repo, demo_dir, tmp_path):
    out = tmp_path / "run"
    flags = base_flags(demo_dir, out, **{"model-name-or-path": "demo-org/absent"})
    result = subprocess.run(launcher_command(*flags), capture_output=True, text=True,
                            env=subprocess_env(**hub_repo.env()), cwd=REPO_ROOT,
                            timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no cached copy in" in lines[0], result.stderr
    assert "--model-revision main" in lines[0] and not out.exists()
