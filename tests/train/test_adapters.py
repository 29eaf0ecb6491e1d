import torch

from tests.conftest import load_plain
from train.policy.adapters import average_adapters, scale_adapter


def lora_adapter(model_dir, out_dir, seed: int, shared_down: dict | None = None) -> dict[str, torch.Tensor]:
    """A rank-4 LoRA adapter on the tiny model with random A and B (A copied from shared_down where given), saved in
    out_dir; each module's update B·A times the scaling, by module name."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(load_plain(model_dir)[0], LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    updates = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            if shared_down is not None:
                module.lora_A["default"].weight.data.copy_(shared_down[name])
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.1)
            updates[name] = module.get_delta_weight("default").detach().clone()
    model.save_pretrained(out_dir)
    return updates


def loaded_updates(model_dir, adapter_dir) -> dict[str, torch.Tensor]:
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_plain(model_dir)[0], str(adapter_dir))
    return {name: module.get_delta_weight("default").detach() for name, module in model.named_modules()
            if hasattr(module, "lora_A") and "default" in module.lora_A}


def test_the_average_of_adapters_that_share_their_down_projections_is_their_mean_update_exactly(tiny_model_dir, tmp_path):
    from peft import PeftModel

    first = lora_adapter(tiny_model_dir, tmp_path / "a", seed=0)
    shared = {name: module.lora_A["default"].weight.detach().clone()
              for name, module in PeftModel.from_pretrained(load_plain(tiny_model_dir)[0], str(tmp_path / "a")).named_modules()
              if hasattr(module, "lora_A") and "default" in module.lora_A}
    second = lora_adapter(tiny_model_dir, tmp_path / "b", seed=1, shared_down=shared)
    average_adapters([tmp_path / "a", tmp_path / "b"], tmp_path / "average")

    averaged = loaded_updates(tiny_model_dir, tmp_path / "average")
    assert averaged.keys() == first.keys() and len(first) > 0
    for name, update in averaged.items():  # the mean of two updates in one rank-4 row space is rank 4: nothing is cut
        torch.testing.assert_close(update, (first[name] + second[name]) / 2, rtol=1e-4, atol=1e-6)
        assert not torch.allclose(first[name], second[name])


def test_the_average_of_unlike_adapters_is_the_best_update_of_their_rank_to_their_mean(tiny_model_dir, tmp_path):
    updates = [lora_adapter(tiny_model_dir, tmp_path / str(seed), seed) for seed in range(3)]
    average_adapters([tmp_path / str(seed) for seed in range(3)], tmp_path / "average")

    averaged = loaded_updates(tiny_model_dir, tmp_path / "average")
    for name, update in averaged.items():
        mean = sum(u[name] for u in updates) / 3
        singular = torch.linalg.svdvals(mean.double())
        assert torch.linalg.matrix_rank(update.double(), rtol=1e-6) == 4 < torch.linalg.matrix_rank(mean.double(), rtol=1e-6)
        # Eckart-Young: the best rank-4 approximation misses exactly the singular values past the 4th.
        torch.testing.assert_close(torch.linalg.norm((update - mean).double()), singular[4:].norm(), rtol=1e-4, atol=1e-7)


def test_a_scaled_adapter_is_the_same_update_from_the_base_shortened(tiny_model_dir, tmp_path):
    """What the predictor registers for a candidate past [round] kl_budget: its update, every module's, times the scale."""
    whole = lora_adapter(tiny_model_dir, tmp_path / "whole", seed=0)
    scale_adapter(tmp_path / "whole", tmp_path / "scaled", 0.3)

    scaled = loaded_updates(tiny_model_dir, tmp_path / "scaled")
    assert scaled.keys() == whole.keys() and len(whole) > 0
    for name, update in scaled.items():
        torch.testing.assert_close(update, 0.3 * whole[name], rtol=1e-5, atol=1e-7)
        assert update.abs().max() > 0
