"""The driving VLA's flow-matching action expert on a Qwen2-VL backbone's KV cache (tiny random models)."""

import numpy as np
import torch

from mmspec.drivers.vla import TrajectoryExpert, integrate_actions, next_text_positions

import _tiny_qwen_vl as T


def _context(rows, only_row=None):
    model = T.build("qwen2_vl")
    inputs = T.make_inputs("qwen2_vl", rows)
    if only_row is not None:  # the same row alone, without its padding (each row here has one image)
        keep = inputs["attention_mask"][only_row].bool()
        patches = (inputs["image_grid_thw"].prod(-1)).tolist()
        first = sum(patches[:only_row])
        inputs = {"input_ids": inputs["input_ids"][only_row][keep][None],
                  "attention_mask": torch.ones(1, int(keep.sum()), dtype=torch.long),
                  "mm_token_type_ids": inputs["mm_token_type_ids"][only_row][keep][None],
                  "pixel_values": inputs["pixel_values"][first: first + patches[only_row]],
                  "image_grid_thw": inputs["image_grid_thw"][only_row: only_row + 1]}
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
    return model, out.past_key_values, next_text_positions(model, inputs), inputs["attention_mask"].bool()


def test_expert_reads_the_cache_and_leaves_it_as_it_was():
    model, cache, start, valid = _context([{"pre": 3, "images": [(56, 56)], "post": 4},
                                           {"pre": 2, "images": [(28, 56)], "post": 2}])
    torch.manual_seed(0)
    expert = TrajectoryExpert(model.config.text_config, horizon=8).eval()
    L = cache.get_seq_length()
    x = torch.randn(2, 8, 2)
    v = expert.velocity(x, torch.tensor([0.3, 0.7]), cache, start, valid)
    assert v.shape == (2, 8, 2) and cache.get_seq_length() == L
    again = expert.velocity(x, torch.tensor([0.3, 0.7]), cache, start, valid)
    assert torch.allclose(v, again, atol=1e-6)  # the crop really restored the context
    # Row 1 alone (its own cache, no padding) gives the same velocity: padding is masked, positions right.
    _, cache1, start1, valid1 = _context([{"pre": 3, "images": [(56, 56)], "post": 4},
                                          {"pre": 2, "images": [(28, 56)], "post": 2}], only_row=1)
    v1 = expert.velocity(x[1:], torch.tensor([0.7]), cache1, start1, valid1)
    assert torch.allclose(v[1:], v1, atol=1e-5)
    acts = expert.sample(cache, start, valid, num_steps=3)
    assert acts.shape == (2, 8, 2) and cache.get_seq_length() == L


def test_expert_learns_a_context_dependent_trajectory():
    """Two contexts, two target action sequences: a few hundred flow-matching steps separate them."""
    torch.manual_seed(0)
    model, cache, start, valid = _context([{"pre": 3, "images": [(56, 56)], "post": 4},
                                           {"pre": 5, "images": [(28, 28)], "post": 2}])
    expert = TrajectoryExpert(model.config.text_config, horizon=8)
    target = torch.tensor([[[2.0, 0.005]] * 8, [[-3.0, -0.005]] * 8])  # within the expert driver's range
    opt = torch.optim.AdamW(expert.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        loss = expert.loss(target, cache, start, valid, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    acts = expert.sample(cache, start, valid, num_steps=10, generator=torch.Generator().manual_seed(1))
    err = (acts - target).abs().mean(dim=(1, 2)) / torch.tensor(1.0)
    assert (acts[0, :, 0] > 0.5).all() and (acts[1, :, 0] < -0.5).all(), acts[:, :, 0]
    traj = integrate_actions(acts.numpy(), np.array([5.0, 5.0]))
    assert traj.shape == (2, 8, 2) and traj[0, -1, 0] > traj[1, -1, 0]
    assert err.max() < 1.0, err
