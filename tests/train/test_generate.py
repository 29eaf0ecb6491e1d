import json
import shutil
from contextlib import closing

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

from store import open_database
from store.policies import add_policy
from store.prompts import prompts_to_generate
from tests.conftest import CHAT_PROMPTS, DEMO_PROMPTS, run_tether, set_settings, shipping_sampling_defaults
from train.common.config import GenerationConfig, ModelConfig
from train.common.errors import ModelError
from train.common.models import load_model
from train.policy.generate import Sampler, generate
from ui.owner.config import RoundConfig
from ui.owner.round_jobs import is_held_back

def reference_greedy(model, tokenizer, messages, max_new_tokens, eos_ids):
    """One prompt at a time, no padding: plain transformers, the ground truth for batching."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    tokens = out[0, ids["input_ids"].shape[1]:].tolist()
    end = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    content = tokens if end is None else tokens[:end]
    return tokenizer.decode(content, skip_special_tokens=True), len(content) + (end is not None), end is not None


def test_batched_generation_matches_one_at_a_time_with_counts_and_eos(tiny_model_dir, tmp_path):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    # The random model never says <|im_end|>; make a token it does produce a second end-of-turn
    # token (as Llama 3 has two), so that some completions finish early and some hit the limit.
    plain = reference_greedy(model, tokenizer, CHAT_PROMPTS[0], 10, [tokenizer.eos_token_id])
    stop = tokenizer(plain[0])["input_ids"][3]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    eos_ids = [tokenizer.eos_token_id, stop]

    config = GenerationConfig(temperature=0, max_new_tokens=10, batch_size=3, per_prompt=1)
    results = generate(model, tokenizer, CHAT_PROMPTS, config, progress=False)

    expected = [reference_greedy(model, tokenizer, p, 10, eos_ids) for p in CHAT_PROMPTS]
    assert [(g.text, g.token_count, g.finished) for g in results] == expected
    assert [g.prompt_index for g in results] == [0, 1, 2]
    assert results[0].finished and results[0].token_count <= 5
    assert any(not g.finished and g.token_count == 10 for g in results)


def test_pairs_are_sampled_with_tethers_settings_only_not_the_models_own(tiny_model_dir, tmp_path):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    ids = tokenizer.apply_chat_template(CHAT_PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    greedy = dict(do_sample=False, max_new_tokens=12, pad_token_id=tokenizer.pad_token_id)
    penalised = model.generate(**ids, **greedy, repetition_penalty=1.3, no_repeat_ngram_size=2)
    assert not torch.equal(penalised, model.generate(**ids, **greedy))  # the defaults below would change these samples

    config = GenerationConfig(temperature=0, max_new_tokens=12, batch_size=3, per_prompt=1)
    plain = generate(model, tokenizer, CHAT_PROMPTS, config, progress=False)
    shipped = load_model(ModelConfig(name_or_path=str(shipping_sampling_defaults(tiny_model_dir, tmp_path))))
    assert generate(*shipped, CHAT_PROMPTS, config, progress=False) == plain  # what [generation] says, and nothing the model ships


def test_sampling_returns_per_prompt_completions_grouped_by_prompt(tiny_model_dir):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    config = GenerationConfig(temperature=1.0, max_new_tokens=8, batch_size=4, per_prompt=3, seed=1)
    results = generate(model, tokenizer, CHAT_PROMPTS, config, progress=False)
    assert [g.prompt_index for g in results] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(0 < g.token_count <= 8 and g.text for g in results)
    assert len({g.text for g in results}) > 1  # sampled, not greedy
    again = generate(model, tokenizer, CHAT_PROMPTS, config, progress=False)
    assert sorted(g.text for g in again) == sorted(g.text for g in results)  # the seed reproduces


@pytest.mark.parametrize("temperature, top_p, top_k, spread, past_the_candidates", [
    (0.8, 0.95, 0, 4.0, False),  # peaked rows: the nucleus lies among the likeliest tokens
    (0.8, 0.95, 0, 0.1, True),  # flat rows: it reaches past them, and the whole vocabulary is sorted
    (0.7, 0.9, 50, 2.0, False),  # top-k, then top-p over what it kept
    (1.3, 1.0, 0, 2.0, True),  # plain sampling, as PPO samples: the whole vocabulary
])
def test_the_sampler_draws_from_the_distribution_transformers_samples_from(temperature, top_p, top_k, spread, past_the_candidates):
    """Tether draws each token itself (train.policy.generate.Sampler), faster on a CPU than transformers' warpers, from the
    distribution their softmax gives: compared exactly, then 20,000 draws against it."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    scores = torch.randn(4, 1000) * spread
    warpers = [TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    expected = LogitsProcessorList(warpers)(None, scores.clone()).softmax(-1)
    assert ((expected > 0).sum(-1) > Sampler.CANDIDATES).all() == past_the_candidates

    sampler = Sampler(temperature, top_p, top_k)
    probs, ids = sampler.distribution(scores)
    ours = probs if ids is None else torch.zeros_like(expected).scatter_(-1, ids, probs)
    assert torch.equal(ours > 0, expected > 0)
    assert torch.allclose(ours / ours.sum(-1, keepdim=True), expected, atol=1e-6)

    rows = scores[:1].expand(2000, -1)
    draws = torch.cat([sampler(None, rows).argmax(-1) for _ in range(10)])
    assert (expected[0, draws] > 0).all()
    counts, want = torch.bincount(draws, minlength=1000).double(), expected[0].double() * len(draws)
    binned = want >= 5  # Pearson's test wants 5 expected in a bin: the rarer tokens share one
    observed = torch.cat([counts[binned], counts[~binned].sum(0, keepdim=True)])
    wanted = torch.cat([want[binned], want[~binned].sum(0, keepdim=True)])
    chi2, dof = (((observed - wanted) ** 2) / wanted.clamp_min(1e-9)).sum().item(), len(observed) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)  # six standard deviations of the statistic


def test_pad_token_is_distinct_from_eos_even_when_the_model_lacks_one(tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.eos_token  # the common broken setup
    tokenizer.save_pretrained(tmp_path)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)
    model, loaded = load_model(ModelConfig(name_or_path=str(tmp_path)))
    assert loaded.pad_token == "<|endoftext|>" and loaded.pad_token_id != loaded.eos_token_id
    assert model.config.pad_token_id == loaded.pad_token_id
    assert loaded.padding_side == "left"


def test_cli_generate_stores_completions_and_pairs_on_the_prompts_policies_train_on(tiny_project):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        prompts = prompts_to_generate(con, 0, None)
    held_back = [p.id for p in prompts if is_held_back(p, RoundConfig().held_back_share)]
    trained_on = [p.id for p in prompts if p.id not in held_back]
    assert held_back and held_back[0] < trained_on[9]  # the demo prompts have held-back ones among the first ten
    result = run_tether("generate", "--per-prompt", "4", "--limit", "5", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    assert "generating" in result.stderr  # the progress bar

    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        completions = con.execute(
            "SELECT id, prompt_id, policy_version, text, token_count, sampling FROM completions ORDER BY id"
        ).fetchall()
        pairs = con.execute("SELECT prompt_id, completion_a, completion_b, strategy FROM pairs").fetchall()
    assert len(completions) == 20
    # No optimiser trains on a held-back prompt, so a vote on two answers of one version there would teach nothing.
    assert sorted({c[1] for c in completions}) == trained_on[:5]
    assert all(c[2] == 0 and 0 < c[4] <= 12 for c in completions)
    assert json.loads(completions[0][5]) == {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.95, "top_k": 0, "seed": None}

    by_id = {c[0]: c for c in completions}
    assert len(pairs) == 10
    for prompt_id, a, b, strategy in pairs:
        assert by_id[a][1] == by_id[b][1] == prompt_id and a != b and strategy == "same_policy"
        assert by_id[a][3] != by_id[b][3]
    assert len({c for p in pairs for c in p[1:3]}) == 20  # each completion in one pair

    again = run_tether("generate", "--limit", "5", "--project", str(tiny_project))
    assert again.returncode == 0, again.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        fresh = con.execute("SELECT DISTINCT prompt_id FROM completions WHERE id > 20 ORDER BY 1").fetchall()
    assert [row[0] for row in fresh] == trained_on[5:10]  # prompts with no completions go first


def test_generate_samples_from_a_policy_adapter(tiny_project, tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    policy = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    policy.save_pretrained(tiny_project / "policies" / "v1")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        add_policy(con, version=1, adapter_path="policies/v1", parent=0)
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model_dir)), str(tiny_project / "policies" / "v1"))
    assert model.active_adapters == ["default"]

    (tiny_project / "p.jsonl").write_text(json.dumps({"prompt": "Hello there!"}) + "\n")  # not held back
    run_tether("prompts", "import", "p.jsonl", "--project", str(tiny_project), cwd=tiny_project, check=True)
    result = run_tether("generate", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    assert "from policy v1" in result.stdout
    # The job's log, which the operator reads, says nothing of libraries' internals: bitsandbytes' optional CPU kernel,
    # with nothing 4-bit here, or PEFT's use of a deprecated transformers property.
    log = next((tiny_project / "jobs").glob("*/worker.log")).read_text()
    assert "peak memory" in log and "kernels-community" not in log and "Warning" not in log
    missing = run_tether("generate", "--policy", "7", "--project", str(tiny_project))
    assert missing.returncode == 1
    assert "no policy version 7 (the project has: 0, 1)" in missing.stderr


def test_generate_without_prompts_says_what_to_do(tiny_project):
    result = run_tether("generate", "--project", str(tiny_project))
    assert result.returncode == 1
    assert "no active prompts" in result.stderr and "Traceback" not in result.stderr
    (tiny_project / "p.jsonl").write_text(json.dumps({"prompt": "Hello there"}) + "\n")  # held back
    run_tether("prompts", "import", str(tiny_project / "p.jsonl"), "--project", str(tiny_project), check=True)
    result = run_tether("generate", "--project", str(tiny_project))
    assert result.returncode == 1
    assert "every active prompt (1) is held back to compare versions on ([round] held_back_share = 0.25)" in result.stderr


def test_a_prompt_too_long_for_the_context_is_named(tiny_project):
    (tiny_project / "p.jsonl").write_text(json.dumps({"prompt": "words " * 600}) + "\n")  # not held back
    run_tether("prompts", "import", str(tiny_project / "p.jsonl"), "--project", str(tiny_project), check=True)
    result = run_tether("generate", "--project", str(tiny_project))
    assert result.returncode == 1
    assert "prompt 1 is" in result.stderr and "does not fit the model's context of 512 tokens" in result.stderr


def test_model_errors_are_one_line(tiny_model_dir, tmp_path):
    with pytest.raises(ModelError, match="cannot load model"):
        load_model(ModelConfig(name_or_path=str(tmp_path)))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}))
    with pytest.raises(ModelError, match="has no chat template"):
        load_model(ModelConfig(name_or_path=str(tmp_path)))


def test_progress_is_reported_after_each_batch(tiny_model_dir):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    reports = []
    config = GenerationConfig(temperature=0, max_new_tokens=4, batch_size=2, per_prompt=1)
    generate(model, tokenizer, CHAT_PROMPTS, config, progress=False, on_progress=lambda done, total: reports.append((done, total)))
    assert reports == [(2, 3), (3, 3)]


def test_kl_to_base_is_the_mean_log_ratio_of_each_answer_alone_and_0_for_a_fresh_adapter(tiny_model_dir):
    from train.policy.generate import Generated, kl_to_base

    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).eval()
    # Answers of different lengths, one cut at the limit (no EOS), so the batch is left-padded.
    answers = [Generated(0, "music and light", 4, True), Generated(1, "the end of the day is near", 7, False), Generated(2, "yes", 2, True)]
    assert kl_to_base(policy, tokenizer, CHAT_PROMPTS, answers, 0.8, batch_size=3) == 0.0  # LoRA's B starts at zero

    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)

    def alone(answer) -> float:
        return log_ratio(policy, tokenizer, answer, tokenizer.encode(answer.text, add_special_tokens=False), 0.8)

    expected = sum(map(alone, answers)) / len(answers)
    assert expected != 0
    assert kl_to_base(policy, tokenizer, CHAT_PROMPTS, answers, 0.8, batch_size=3) == pytest.approx(expected, abs=1e-4)
    assert kl_to_base(policy, tokenizer, CHAT_PROMPTS, answers, 0.8, batch_size=1) == pytest.approx(expected, abs=1e-4)


def log_ratio(policy, tokenizer, answer, response: list[int], temperature: float) -> float:
    """log pi(response) - log pi_0(response) to the answer's prompt, the answer's EOS included where it ended."""
    prompt = tokenizer.apply_chat_template(CHAT_PROMPTS[answer.prompt_index], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    response = response + [tokenizer.eos_token_id] * answer.finished
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        on = (policy(input_ids=ids).logits[0, :-1] / temperature).log_softmax(-1)
        with policy.disable_adapter():
            off = (policy(input_ids=ids).logits[0, :-1] / temperature).log_softmax(-1)
    targets = ids[0, 1:]
    rows = torch.arange(len(targets))[-len(response):]
    return (on[rows, targets[rows]] - off[rows, targets[rows]]).sum().item()


def test_kl_to_base_reads_the_tokens_the_policy_sampled_not_their_text_encoded_again(tiny_model_dir):
    """The tiny model's answers never encode back to the tokens sampled, and their KL read -4.5 nats where a policy had
    moved: the KL budget held nothing. Its own samples are what the KL of a policy to the base is an expectation over."""
    from train.policy.generate import kl_to_base

    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    policy = random_policy(model)
    answers = generate(policy, tokenizer, CHAT_PROMPTS, GenerationConfig(max_new_tokens=8, per_prompt=2, seed=0), progress=False)
    assert all(a.tokens is not None and len(a.tokens) == a.token_count - a.finished for a in answers)
    assert any(list(a.tokens) != tokenizer.encode(a.text, add_special_tokens=False) for a in answers)
    expected = sum(log_ratio(policy, tokenizer, a, list(a.tokens), 0.8) for a in answers) / len(answers)
    assert kl_to_base(policy, tokenizer, CHAT_PROMPTS, answers, 0.8, batch_size=4) == pytest.approx(expected, abs=1e-4)


def random_policy(model, seed: int = 0):
    """A LoRA policy on every linear layer with B drawn at random, as a trained policy's is, so that folding changes the weights."""
    torch.manual_seed(seed)  # A's initial draw too: two policies made alike are the same
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).eval()
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return policy


def base_weights(policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.named_parameters() if "lora_" not in name}


def changed_weights(policy, before: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, p in policy.named_parameters() if "lora_" not in name and not torch.equal(p, before[name])]


@pytest.fixture
def folding(tiny_model_dir):
    """A random policy on the tiny model in float32, its tokenizer, its base weights, a prompt's ids and its logits there."""
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    policy = random_policy(model)
    ids = tokenizer.apply_chat_template(CHAT_PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        unfolded = policy(**ids).logits
    return policy, tokenizer, base_weights(policy), ids, unfolded


def test_a_policy_samples_with_its_lora_folded_the_tokens_it_samples_unfolded_and_its_base_comes_back_bit_for_bit(folding):
    from train.policy.generate import end_of_turn_ids, lora_folded

    policy, tokenizer, before, ids, unfolded = folding
    with torch.no_grad(), lora_folded(policy):
        folded = policy(**ids).logits
        changed = changed_weights(policy, before)
    assert len(changed) == 2 * 7  # each layer's seven linear weights carry the fold, and nothing else does
    assert torch.allclose(folded, unfolded, atol=1e-5) and not torch.equal(folded, unfolded)  # computed another way, the same policy

    eos = sorted(end_of_turn_ids(policy, tokenizer))
    config = GenerationConfig(temperature=0, max_new_tokens=10, batch_size=3, per_prompt=1)
    ours = generate(policy, tokenizer, CHAT_PROMPTS, config, progress=False)
    assert [(g.text, g.token_count, g.finished) for g in ours] == [reference_greedy(policy, tokenizer, p, 10, eos) for p in CHAT_PROMPTS]
    assert changed_weights(policy, before) == []


def test_a_fold_that_runs_out_of_memory_halfway_puts_back_what_it_folded_and_samples_unfolded(folding, monkeypatch):
    from peft.tuners.lora import Linear

    from train.policy.generate import lora_folded

    policy, _, before, ids, unfolded = folding
    delta = Linear.get_delta_weight
    calls = []

    def runs_out_of_memory_at_the_fifth(layer, adapter):  # as a GPU does when the fold's arithmetic does not fit
        calls.append(adapter)
        if len(calls) == 5:
            raise torch.OutOfMemoryError("out of memory")
        return delta(layer, adapter)

    monkeypatch.setattr(Linear, "get_delta_weight", runs_out_of_memory_at_the_fifth)
    with torch.no_grad(), lora_folded(policy):
        assert len(calls) == 5 and changed_weights(policy, before) == []
        assert torch.equal(policy(**ids).logits, unfolded)
    assert changed_weights(policy, before) == []


def test_without_free_memory_for_the_copy_a_policy_samples_through_its_adapter_unfolded(folding, monkeypatch):
    import train.policy.generate
    from train.policy.generate import lora_folded

    policy, _, before, ids, unfolded = folding
    monkeypatch.setattr(train.policy.generate, "free_bytes", lambda device: 1024)  # a machine out of memory, not a stand-in for the fold
    with torch.no_grad(), lora_folded(policy):
        assert torch.equal(policy(**ids).logits, unfolded)
        assert changed_weights(policy, before) == []


def test_a_quantised_policy_samples_through_its_adapter_unfolded(tiny_model_dir):
    from train.policy.generate import lora_folded

    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir), quantization="8bit"))
    policy = random_policy(model)
    ids = tokenizer.apply_chat_template(CHAT_PROMPTS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        unfolded = policy(**ids).logits
        with lora_folded(policy):
            assert torch.equal(policy(**ids).logits, unfolded)


def test_a_static_cache_samples_the_dynamic_ones_tokens_in_batches_of_one_size(tiny_model_dir):
    config = GenerationConfig(temperature=0, max_new_tokens=10, batch_size=2, per_prompt=1)
    dynamic, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    static, _ = load_model(ModelConfig(name_or_path=str(tiny_model_dir), compile=True))
    assert dynamic.generation_config.cache_implementation is None  # 'auto' is off on a CPU
    assert static.generation_config.cache_implementation == "static"
    policies = [random_policy(m) for m in (dynamic, static)]
    reports, batch_sizes = [], set()
    hook = static.register_forward_pre_hook(lambda module, args, kwargs: batch_sizes.add(kwargs["input_ids"].shape[0]), with_kwargs=True)
    static_answers = generate(policies[1], tokenizer, CHAT_PROMPTS, config, progress=False,
                              on_progress=lambda done, total: reports.append((done, total)))
    hook.remove()
    # The last batch of one was filled up to two, so as not to compile again, and its extra answer dropped.
    assert batch_sizes == {2}
    assert static_answers == generate(policies[0], tokenizer, CHAT_PROMPTS, config, progress=False)
    assert len(static_answers) == 3 and reports == [(2, 3), (3, 3)]


def test_auto_compiles_on_a_gpu_with_a_base_not_quantised_in_a_job_long_enough_to_pay_the_compile_back():
    from dataclasses import replace

    from train.common.models import COMPILE_PAYS_FROM, compiles, decode_steps_for

    gpu = ModelConfig(device="cuda")
    assert compiles(gpu, COMPILE_PAYS_FROM) and not compiles(gpu, COMPILE_PAYS_FROM - 1)
    assert not compiles(replace(gpu, quantization="4bit"), 10**6) and not compiles(ModelConfig(device="cpu"), 10**6)
    assert compiles(ModelConfig(device="cpu", compile=True), 0) and not compiles(replace(gpu, compile=False), 10**6)
    assert decode_steps_for(65, 16, 64) == 5 * 64  # a last batch of one takes its steps too


def test_cli_generate_with_four_answers_per_task_makes_tasks_to_rank(tiny_project):
    set_settings(tiny_project, "queue", answers_per_task=4)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    result = run_tether("generate", "--per-prompt", "2", "--limit", "3", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr

    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        per_prompt = con.execute("SELECT prompt_id, list(id ORDER BY id) FROM completions GROUP BY 1").fetchall()
        tasks = con.execute("SELECT id, prompt_id, answers FROM pairs WHERE answers IS NOT NULL").fetchall()
        pairs = con.execute("SELECT id, task, completion_a, completion_b FROM pairs").fetchall()
    assert len(per_prompt) == 3 and all(len(ids) == 4 for _, ids in per_prompt)  # raised to K answers a prompt
    assert tasks and all(len(answers) >= 3 for _, _, answers in tasks)
    for lead, prompt_id, answers in tasks:
        assert set(answers) <= set(dict(per_prompt)[prompt_id])
        own = {(a, b) for id_, task, a, b in pairs if id_ == lead or task == lead}
        assert own == {(a, b) for i, a in enumerate(answers) for b in answers[i + 1:]}
