"""Shared fixtures: a tiny random-weight Llama with a real chat tokenizer, and projects on disk."""

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch
from click.testing import CliRunner
from gradio_client import Client
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from store import open_database
from store.prompts import Prompt
from train.common.config import PPOConfig, RewardModelConfig
from train.policy.ppo import RewardScorer, build, position_ids
from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE
from train.reward.lora import build_model
from train.reward.versions import read_reward_adapter
from ui.cli import cli
from ui.owner.jobs import WORKER_ENV
from ui.owner.project import init_project
from ui.owner.round_jobs import is_held_back

REPO = Path(__file__).resolve().parent.parent
DEMO_PROMPTS = REPO / "scripts" / "demo_prompts.jsonl"
SHARED_DATA = REPO.parent / "shared" / "data"

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(special_tokens: list[str], eos_token: str, pad_token: str | None, chat_template: str) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained on the demo prompts, with these special tokens."""
    corpus = [json.dumps(json.loads(line)) for line in DEMO_PROMPTS.read_text().splitlines()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos_token, pad_token=pad_token, chat_template=chat_template)


def save_tiny_llama(path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """A 2-layer Llama with random weights for this tokenizer, saved like any Hugging Face model directory."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a test marked `deep` first: they are the long files, in either tier. The two test processes take
    a file at a time in this order (scripts/test.sh turns off xdist's own, most tests first, which put the files of
    one long test last): a long file taken last keeps one process at work while the other has nothing left."""
    long_files = {item.path for item in items if item.get_closest_marker("deep")}
    items.sort(key=lambda item: item.path not in long_files)


@pytest.fixture(autouse=True)
def jobs_run_where_they_start(request, monkeypatch):
    """Jobs that run_here starts (every `tether` command's) run the worker's code in that very process, which
    skips a worker process's start (6 to 8 s of imports), except in tests about the worker process itself
    (marked worker_process). The app's jobs always start worker processes."""
    if not request.node.get_closest_marker("worker_process"):
        monkeypatch.setenv(WORKER_ENV, "here")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny Llama with a ChatML tokenizer whose pad, <|endoftext|>, differs from its EOS, <|im_end|>."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>",
                                pad_token="<|endoftext|>", chat_template=CHATML)
    save_tiny_llama(path, tokenizer)
    return path


@pytest.fixture
def tiny_project(tmp_path, tiny_model_dir) -> Path:
    """A project on the tiny model with short completions; its rounds train one candidate and register it whatever the
    predictor says (tests of the predictor's choice set [round] candidates and register themselves)."""
    root = tmp_path / "project"
    init_project(root, str(tiny_model_dir))
    set_settings(root, "generation", max_new_tokens=12)
    set_settings(root, "round", candidates=1, register="best", min_pairs=1)
    return root


def complete_round(con, round_id: int) -> None:
    """Walk a running round through the stages of one that registered a version and paired its answers, to done."""
    from store.db import utcnow
    from store.rounds import Stage, get_round, move_round

    path = [Stage.REWARD_MODEL, Stage.CANDIDATES, Stage.PREDICTOR, Stage.PAIRS, Stage.DONE]
    for stage in path[path.index(get_round(con, round_id).stage) + 1:]:
        assert move_round(con, round_id, stage, utcnow() if stage == Stage.DONE else None)


def set_settings(project: Path, section: str, **values) -> None:
    """Change settings of one section of the project's tether.toml, as a user would edit it.

    Each key must already be there (init writes every setting), so a renamed one fails loudly.
    """
    path = project / "tether.toml"
    text = path.read_text()
    start = text.index(f"[{section}]\n")
    end = text.find("\n[", start)
    end = len(text) if end == -1 else end
    body = text[start:end]
    for key, value in values.items():
        body, found = re.subn(rf"(?m)^#? ?{key} = .*$", f"{key} = {json.dumps(value)}", body)
        assert found == 1, f"[{section}] of {path} has no setting {key}"
    path.write_text(text[:start] + body + text[end:])


def run_tether(*args: str, env: dict[str, str] | None = None, input: str | None = None, check: bool = False,
               **kwargs) -> subprocess.CompletedProcess:
    """The real `tether` command as a user runs it, its exit code and output as a child process gives them.

    It runs in this process, where torch is imported already (a child spends 1 to 4 s starting), unless
    the test needs a process of its own: `serve`, or its own environment, working directory or time
    limit (`env`, `cwd`, `timeout`: a fault injected through the environment may kill the process).
    """
    if env or kwargs or args[0] == "serve":
        tether = Path(sys.executable).parent / "tether"
        return subprocess.run([str(tether), *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                              input=input, check=check, **kwargs)
    result = CliRunner().invoke(cli, list(args), input=input, prog_name="tether")
    stderr = result.stderr
    if result.exception and not isinstance(result.exception, SystemExit):  # as Python prints an uncaught one
        stderr += "".join(traceback.format_exception(result.exception))
    done = subprocess.CompletedProcess(["tether", *args], result.exit_code, result.stdout, stderr)
    if check:
        done.check_returncode()
    return done


@contextmanager
def tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `mount_point` with mount `options` (a size, a number of inodes) until the end; needs root."""
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def fill(path: Path) -> None:
    """Write to `path` until its filesystem has no space left, down to the last byte."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (2**16, 2**12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """A real `tether serve` in a child process, on 127.0.0.1 unless another address is given."""

    def __init__(self, project: Path, log_dir: Path | None = None, host: str = "127.0.0.1"):
        self.project = project
        self.port = free_port()
        self.url = f"http://{host}:{self.port}/"
        self.log = (log_dir or project) / f"serve-{self.port}.log"
        tether = Path(sys.executable).parent / "tether"
        self.process = subprocess.Popen(
            [str(tether), "serve", "--project", str(project), "--host", host, "--port", str(self.port)],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tether serve exited:\n{self.log.read_text()}")
            try:
                urllib.request.urlopen(self.url, timeout=1)
                # Written once the app serves, so `tether` commands find it; a killed server's may still be there.
                if json.loads((project / "tether.server.json").read_text())["pid"] == self.process.pid:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tether serve did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        """Shut down as a service manager does, so the database is closed cleanly."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def crash(self) -> None:
        self.process.kill()  # SIGKILL: no cleanup of any kind
        self.process.wait()


def app_client(url: str, user: str, password: str, **kwargs) -> Client:
    """gradio_client's Client, signed in as user, on a test server's plain-HTTP address. Without a certificate store
    (ssl_verify=False: loopback HTTP has no TLS to verify), since gradio_client loads one for every request it makes:
    about 0.1 s of CPU a call, 11 times what the call costs without it."""
    return Client(url, auth=(user, password), verbose=False, ssl_verify=False, **kwargs)


def add_users(project: Path, users: dict[str, str], password: str = "password-123") -> None:
    """Accounts {name: role}, all with the same password, through the real CLI."""
    for name, role in users.items():
        run_tether("users", "add", name, "--role", role, "--project", str(project), input=password + "\n", check=True)


def add_pairs(project: Path, prompts: int, texts: Callable[[int, int], str] | None = None, overlap_share: float = 0.0,
              answers_per_task: int = 2) -> None:
    """Prompts with two completions each and a pair per prompt, without a model; or, with answers_per_task K > 2,
    K completions each and a task to rank per prompt."""
    from annotate.pairs import add_completions_with_pairs
    from annotate.queue import QueueConfig
    from store import open_database
    from store.completions import NewCompletion
    from store.prompt_files import NewPrompt
    from store.prompts import add_prompts

    texts = texts or (lambda prompt, k: f"answer {k} to question {prompt}")
    with closing(open_database(project / "tether.duckdb")) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"question {i}"}], "test") for i in range(prompts)])
        ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id DESC LIMIT ?", [prompts]).fetchall()][::-1]
        completions = [NewCompletion(pid, 0, texts(pid, k), 5, True, {}) for pid in ids for k in range(answers_per_task)]
        add_completions_with_pairs(con, completions, QueueConfig(overlap_share=overlap_share, answers_per_task=answers_per_task))


PLAIN_PEFT_SCORER = """
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

base, adapter, dtype, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.stdin.read())
tokenizer = AutoTokenizer.from_pretrained(adapter)
trained = json.load(open(f"{adapter}/metrics.json"))["config"]
model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=trained["heads"], dtype=getattr(torch, dtype))
model = PeftModel.from_pretrained(model, adapter).eval()
norm = json.load(open(f"{adapter}/reward_normalization.json"))
max_length = trained["max_length"]
scores = []
with torch.no_grad():
    for prompt, response in cases:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        ids = list(ids) + tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = ids[-max_length:]  # a long prompt loses its start, as in training
        raw = model(input_ids=torch.tensor([ids])).logits.float()[0].tolist()  # each head's
        heads = [(r - m) / s for r, m, s in zip(raw, norm["mean"], norm["std"])]
        scores.append({"raw": raw, "normalised": sum(heads) / len(heads)})  # the reward: the heads' mean
assert not any(name == "tether" or name.split(".")[0] in ("train", "store", "annotate", "ui") for name in sys.modules)
print(json.dumps(scores))
"""


def score_with_plain_peft(
    base: Path, adapter: Path, cases: list[tuple[list[dict], str]], tmp_path: Path, dtype: str = "float32"
) -> list[dict[str, float]]:
    """Reward-model scores of (prompt messages, response) cases, from a fresh Python process that
    imports only torch, transformers and peft: what a user without Tether would run, the base in `dtype`."""
    script = tmp_path / "plain_peft_scorer.py"
    script.write_text(PLAIN_PEFT_SCORER)
    result = subprocess.run(
        [sys.executable, str(script), str(base), str(adapter), dtype],
        input=json.dumps(cases), capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def worker_pids(project: Path, job_id: int) -> list[int]:
    """The worker processes running this project's job (only this project's: other runs may have a job 1 too)."""
    pattern = f"train.worker {re.escape(str(project / 'jobs' / str(job_id)))}$"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def shipping_sampling_defaults(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of a model directory whose generation_config.json ships a repetition penalty, as Qwen2.5-Instruct's does."""
    copy = tmp_path / "ships-defaults"
    shutil.copytree(model_dir, copy)
    generation = json.loads((copy / "generation_config.json").read_text()) if (copy / "generation_config.json").exists() else {}
    (copy / "generation_config.json").write_text(json.dumps(generation | {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}))
    return copy


def act(queue, con, action, now):
    """One action on a LiveQueue, as a batch of one, as the server does it; a refusal raised as QueueError."""
    from store.queue import QueueError

    (outcome,) = queue.act(con, [action], now)
    if outcome.refused:
        raise QueueError(outcome.refused)
    return outcome


def serve(queue, con, annotator: str, now):
    """The pair to show the annotator: their open lease, or a new one; None when none is left for them."""
    from annotate.queue import Action

    return act(queue, con, Action("serve", annotator), now).assignment


def vote(queue, con, annotator: str, token: str, choice: str, strength, comment, now):
    """The vote stored (or found stored), and the next pair to show."""
    from annotate.queue import Action

    outcome = act(queue, con, Action("vote", annotator, token, choice, strength, comment), now)
    return outcome.vote, outcome.assignment


def skip(queue, con, annotator: str, token: str, now):
    """Skip the pair; returns the next pair to show."""
    from annotate.queue import Action

    return act(queue, con, Action("skip", annotator, token), now).assignment


def vote_through_queue(con, annotator: str, choose: Callable | None = None, now=None) -> int:
    """Vote on every pair the queue serves `annotator`, through `LiveQueue` as the server does; returns the votes.
    `choose(assignment)` gives the screen choice, strength and comment: 'left' with neither unless given."""
    from annotate.queue import LiveQueue, QueueConfig
    from store.db import utcnow

    now = now or utcnow()
    queue = LiveQueue.load(con, QueueConfig(), now)
    assignment, votes = serve(queue, con, annotator, now), 0
    while assignment is not None:
        choice, strength, comment = choose(assignment) if choose else ("left", None, None)
        _, assignment = vote(queue, con, annotator, assignment.token, choice, strength, comment, now)
        votes += 1
    return votes


def vote_every_pair(project: Path, annotator: str = "tester") -> int:
    """Vote 'left' on every pair through the queue, as the app does, as an annotator account made for it if there is
    none; returns the votes."""
    from store import open_database
    from store.db import utcnow
    from store.users import add_user, get_user

    with closing(open_database(project / "tether.duckdb")) as con:
        if get_user(con, annotator) is None:
            add_user(con, annotator, "annotator", "not a password hash: it never signs in", "a test", utcnow())
        return vote_through_queue(con, annotator)


def vote_on_demo_pairs(project: Path) -> int:
    """Import the demo prompts, sample v0's pairs of answers to them, and vote on every pair; returns the votes."""
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(project), check=True)
    run_tether("generate", "--project", str(project), check=True)
    return vote_every_pair(project)


def toy_preferences(path: Path, n: int = 40, start: int = 0) -> Path:
    rows = [
        {"prompt": f"Question {i}: what do you like?", "chosen": f"I like cats and {i} dogs. Thank you!", "rejected": f"No. {i}"}
        for i in range(start, start + n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def wait_for(condition, seconds=120.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.3)
    raise AssertionError("timed out waiting")


def short_training(project: Path) -> None:
    set_settings(project, "ppo", steps=1, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6)
    set_settings(project, "reward_model", batch_size=4)


def held_back_ids(project: Path, share: float = 0.25) -> set[int]:
    with closing(open_database(project / "tether.duckdb")) as con:
        rows = con.execute("SELECT id, content_hash FROM prompts WHERE active").fetchall()
    return {pid for pid, content_hash in rows if is_held_back(Prompt(pid, [], content_hash, 0), share)}


def read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


CHAT_PROMPTS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief and kind."}, {"role": "user", "content": "How do plants make their food?"}],
    [{"role": "user", "content": "Why do cats purr when they are happy?"}],
]


PPO_PROMPTS = [[{"role": "user", "content": "Name a fruit."}], [{"role": "user", "content": "Say something nice about music and light."}]]


def load_plain(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


@pytest.fixture(scope="session")
def peaked_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a sharpened LM head, so its first tokens are a handful of likely ones PPO can see often."""
    model, tokenizer = load_plain(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    path = tmp_path_factory.mktemp("peaked")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def first_token_probs(model_dir, policy_dir=None) -> torch.Tensor:
    """(V,) the mean over PPO_PROMPTS of the policy's distribution of the first response token."""
    model, tokenizer = load_plain(model_dir)
    if policy_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, policy_dir)
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for p in PPO_PROMPTS]
    batch = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    positions = position_ids(batch["attention_mask"])
    with torch.no_grad():
        logits = model(**batch, position_ids=positions).logits[:, -1]
    return logits.softmax(-1).mean(0)


def token_reward_model(model_dir, token_id: int, candidates: torch.Tensor, out_dir, scale: float = 8.0, heads=(1.0,)):
    """A reward model that favours one token as a one-token response: no LoRA change, and a head
    along the difference between the hidden state it leaves at the closing EOS (where the score is
    read) and the mean of the other candidates'. The prompts' own last states are projected out,
    so the value PPO starts from reads 0 before the response, as a fresh critic would. `heads`
    gives each head its multiple of that direction."""
    model, tokenizer = build_model(str(model_dir), RewardModelConfig(heads=len(heads)))
    direction, prompt_states = 0, []
    for messages in PPO_PROMPTS:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        ids = torch.tensor([[*prompt, t, tokenizer.eos_token_id] for t in candidates.tolist()])
        with torch.no_grad():
            hidden = model.get_base_model().model(input_ids=ids).last_hidden_state  # (N, T, H)
        direction = direction + hidden[candidates == token_id][0, -1] - hidden[candidates != token_id, -1].mean(0)
        prompt_states.append(hidden[0, len(prompt) - 1])
    basis, _ = torch.linalg.qr(torch.stack(prompt_states, dim=1))  # (H, prompts)
    direction = direction - basis @ (basis.T @ direction)
    with torch.no_grad():
        multiples = torch.tensor(heads).unsqueeze(1)  # (K, 1)
        model.get_base_model().score.modules_to_save["default"].weight.copy_(multiples * scale * direction / direction.norm())
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / NORMALIZATION_FILE).write_text(json.dumps({"mean": [0.0] * len(heads), "std": [1.0] * len(heads)}))
    (out_dir / METRICS_FILE).write_text(json.dumps({"config": {"max_length": 512, "heads": len(heads)}}))
    return out_dir


@pytest.fixture(scope="session")
def favoured(peaked_model_dir, tmp_path_factory):
    """(token, reward_dir): the policy's third-likeliest first token, and a reward model that favours it."""
    candidates = first_token_probs(peaked_model_dir).topk(20).indices
    token = candidates[2].item()
    return token, token_reward_model(peaked_model_dir, token, candidates, tmp_path_factory.mktemp("rm-token"))


@pytest.fixture
def wrapped(peaked_model_dir, favoured):
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(batch_size=8, minibatch_size=4, max_new_tokens=6, temperature=1.0, learning_rate=1e-3, epochs=2)
    reward = read_reward_adapter(favoured[1])
    return build(model, reward, config), tokenizer, config, RewardScorer(tokenizer, reward.normalization, 512)
