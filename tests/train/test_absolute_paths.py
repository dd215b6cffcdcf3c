"""The config's paths are absolute from the moment it loads (issue 29, item 3).

Ray workers read and write the run's paths too: the learner group loads the SFT model from the run folder and
writes its shards to `checkpoints/step-N/learner_shards/`, and rollout workers read the environment's dataset. A
relative `--out` or dataset means one place in the driver's working folder and another in a worker's (on
another node, or started in another folder). Each path is made absolute against the folder the config was
loaded in, so the same folder is meant wherever the path is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stare_agents.train.config import load_config


def test_a_relative_out_from_another_working_folder_stays_where_it_was_given(tmp_path, monkeypatch) -> None:
    """Loaded in one folder, used in another (as a worker does): the run folder is the one the user meant."""
    given, other = tmp_path / "given", tmp_path / "other"
    given.mkdir()
    other.mkdir()
    (given / "data").mkdir()
    (given / "data" / "tasks.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    (given / "sft.jsonl").write_text("{}\n")
    monkeypatch.chdir(given)
    config = load_config(
        recipe="tiny",
        overrides=[
            "out_dir=runs/rel",
            "sft.data=sft.jsonl",
            "eval.data_dir=data",
            "env.kwargs.dataset=data/tasks.jsonl",
            "env.kwargs.heldout_dataset=owner/hub-id",  # not a path here: a Hugging Face id, left as it is
        ],
    )
    assert config.out_dir == str(given / "runs" / "rel")
    assert config.sft.data == str(given / "sft.jsonl") and config.eval.data_dir == str(given / "data")
    kwargs = config.env.kwargs
    assert (kwargs["dataset"], kwargs["heldout_dataset"]) == (
        str(given / "data" / "tasks.jsonl"),
        "owner/hub-id",
    )
    assert load_config(recipe="tiny").model.name == "tiny"  # a prepared model's name is no path

    from stare_agents.train.trainer import SFT_MODEL, Trainer

    monkeypatch.chdir(other)
    trainer = Trainer(config)
    assert trainer.folder == given / "runs" / "rel" and (trainer.folder / "config.yaml").is_file()
    assert (trainer.folder / SFT_MODEL).is_absolute()  # what the learner group loads after SFT
    assert not (other / "runs").exists()
    # a worker started in yet another folder gets the config as the driver has it and finds the same folder
    code = (
        "import json, sys\nfrom stare_agents.train.config import load_config\n"
        "c = load_config(path=sys.argv[1])\nprint(json.dumps([c.out_dir, c.env.kwargs['dataset']]))\n"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code, str(trainer.folder / "config.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0, seen.stderr[-2000:]
    out_dir, dataset = json.loads(seen.stdout.strip().splitlines()[-1])
    assert out_dir == str(given / "runs" / "rel") and Path(dataset).is_file()


def test_a_local_model_folder_is_made_absolute(tmp_path, monkeypatch) -> None:
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config = load_config(recipe="tiny", overrides=["model.name=models/mine"])
    assert config.model.name == str(tmp_path / "models" / "mine")
    assert load_config(recipe="tiny", overrides=["model.name=owner/model"]).model.name == "owner/model"
