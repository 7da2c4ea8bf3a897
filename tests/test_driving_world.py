"""The driving world: determinism, scripted events and their rule-derived reasoning, the expert's safety,
and clips that round-trip through PyAV (write) and decord (read)."""

import numpy as np
import pytest

from mmspec.drivers.clips import FUTURE_TICKS, HISTORY_TICKS, load_clip, sample_at, write_clip
from mmspec.drivers.world import (CAR_LEN, DT, LABELS, LOOKAHEAD_M, SCENARIO_KINDS, Road, Scenario, hazard_at,
                                  make_scenario, perturbed_expert, reasoning_text, render_frame, road_ahead,
                                  safety_events, scenario_for, simulate)
from mmspec.workloads import get_workload, seed_for


def test_items_are_deterministic_and_splits_differ():
    wl = get_workload("driving")
    a, b = wl.example("test", 3), get_workload("driving").example("test", 3)
    assert a.prompt == b.prompt and a.target == b.target and a.meta["kind"] == b.meta["kind"]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))
    assert np.array_equal(a.meta["future"], b.meta["future"]) and a.meta["future"].shape == (FUTURE_TICKS, 2)
    assert a.meta["history"].shape == (HISTORY_TICKS, 3) and len(a.images) == 4 and a.images[0].size == (224, 112)
    other = wl.example("train", 3)
    assert not np.array_equal(other.meta["future"], a.meta["future"])
    assert wl.text_example("test", 3).target == a.target  # no pixels, same content


@pytest.mark.parametrize("kind,expected", [("lead_brake", "lead_braking"), ("cut_in", "cut_in"),
                                           ("red_light", "red_light"), ("pedestrian", "pedestrian"),
                                           ("parked", "parked")])
def test_each_scripted_event_is_named_by_the_rules(kind, expected):
    seen = set()
    for i in range(4):
        sim = simulate(scenario_for("train", i, kind=kind), seconds=8.0)
        seen |= {hazard_at(sim, k).kind for k in range(sim.ticks)}
    assert expected in seen, seen


def test_reasoning_sentences_carry_the_hazard_fields():
    sim = simulate(make_scenario(5, "lead_brake"), seconds=6.0)
    for k in range(0, sim.ticks, 7):
        h = hazard_at(sim, k)
        text = reasoning_text(h)
        assert text.endswith(h.action + ".")
        if h.distance is not None:
            assert f" {h.distance} m ahead" in text


def test_the_expert_never_hits_the_lead_and_stops_for_red():
    for i in range(12):
        scn = scenario_for("test", i, kind=SCENARIO_KINDS[i % len(SCENARIO_KINDS)])
        sim = simulate(scn, seconds=10.0)
        for k in range(sim.ticks):
            for a in sim.agents[k]:
                if a["kind"] == "lead" and abs(a["offset"]) < 1.0:
                    assert a["s"] - CAR_LEN / 2 - sim.ego_s[k] > 1.0, (i, k)
            if scn.light is not None and sim.light_color[k] == "red":
                assert sim.ego_s[k] < scn.light["s"] + 0.5 or sim.ego_s[k] > scn.light["s"] + 5, (i, k)
        assert all(e[3] >= 0 for e in sim.ego)


@pytest.mark.parametrize("kind", ["pedestrian", "cut_in"])
def test_the_expert_is_never_handed_an_unavoidable_event(kind):
    # Scenarios must start their events where stopping is possible; the closed-loop rates are meaningless
    # otherwise (the expert collided in 5% of clips before the sampler enforced it).
    for split in ("train", "test"):
        for i in range(40):
            ev = safety_events(simulate(scenario_for(split, i, kind=kind), seconds=12.0))
            assert not (ev["collision"] or ev["offroad"] or ev["red_light"]), (split, i, ev)


def test_clip_round_trips_through_video(tmp_path):
    prefix = write_clip(str(tmp_path), "test", 1, seconds=9.0, cameras=("front", "left"))
    sim = simulate(scenario_for("test", 1), seconds=9.0)
    clip = load_clip(prefix)
    assert clip.ticks == sim.ticks and clip.frames["front"].shape == (sim.ticks, 112, 224, 3)
    assert np.array_equal(clip.ego, np.stack(sim.ego))
    err = np.abs(clip.frames["front"][30].astype(int) - np.asarray(render_frame(sim, 30)).astype(int)).mean()
    assert err < 4.0, err  # H.264 at crf 18: small, lossy
    t = HISTORY_TICKS + 2
    a, b = sample_at(clip, t), sample_at(sim, t)
    assert np.allclose(a["history"], b["history"]) and np.allclose(a["future"], b["future"])
    assert a["reasoning"] == b["reasoning"] and len(a["frames"]["front"]) == 4
    mtime = (tmp_path / "test-000001.npz").stat().st_mtime_ns
    write_clip(str(tmp_path), "test", 1, seconds=9.0, cameras=("front", "left"))  # already there: left as it is
    assert (tmp_path / "test-000001.npz").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError):
        sample_at(clip, clip.ticks - 2)


def test_future_is_consistent_with_the_speed():
    ex = get_workload("driving").example("test", 2)
    fut = ex.meta["future"]
    step = np.linalg.norm(np.diff(np.vstack([[0, 0], fut]), axis=0), axis=1)
    assert step.max() <= 20 * DT  # below 20 m/s between waypoints
    assert abs(step[0] - ex.meta["speed"] * DT) < 0.3


def test_recorded_actions_reproduce_the_future():
    """Integrating the expert's (accel, curvature) with the unicycle from the current state gives back the
    ground-truth waypoints: the action space a trajectory head predicts is exact."""
    ex = get_workload("driving").example("test", 4)
    acc, curv = ex.meta["actions"][:, 0], ex.meta["actions"][:, 1]
    x = y = yaw = 0.0
    v = ex.meta["speed"]
    pts = []
    for a, k in zip(acc, curv):
        x, y = x + v * np.cos(yaw) * DT, y + v * np.sin(yaw) * DT
        yaw, v = yaw + v * k * DT, max(0.0, v + a * DT)
        pts.append((x, y))
    assert np.allclose(np.array(pts), ex.meta["future"], atol=1e-3)


def test_label_rendering_matches_the_picture():

    sim = simulate(scenario_for("test", 0, kind="lead_brake"), seconds=2.0)
    rgb = np.asarray(render_frame(sim, 10))
    lab = np.asarray(render_frame(sim, 10, labels=True))
    assert lab.shape == rgb.shape[:2] and lab.max() < len(LABELS)
    road = lab == LABELS.index("road")
    assert road.sum() > 1000 and np.abs(rgb[road].astype(int) - (70, 70, 75)).max() == 0
    assert (lab == LABELS.index("vehicle")).sum() > 0  # the lead car is in view
    assert (lab[: lab.shape[0] // 3] == LABELS.index("sky")).mean() > 0.9


def test_safety_events_catch_a_crash_and_a_departure():
    from mmspec.drivers.world import safety_events

    scn = scenario_for("test", 3, kind="lead_brake")
    crash = simulate(scn, seconds=8.0, policy=lambda sim, k: (2.0, 0.0) if k > 5 else None)  # never brakes
    assert safety_events(crash)["collision"]
    off = simulate(scenario_for("test", 4, kind="cruise"), seconds=5.0, policy=lambda sim, k: (0.0, -0.1))
    assert safety_events(off)["offroad"] and not safety_events(simulate(scn, seconds=8.0))["collision"]


def test_perturbed_items_show_a_drift_and_the_experts_recovery():
    """Half the items of a perturbed workload start off the lane centre or off the expert's speed; their
    future is the expert's recovery (back near the centre), they are deterministic, and items never teach a
    crash; the default workload draws no perturbation (its items are unchanged)."""
    wl = get_workload("driving", perturb=0.5, size=(112, 56))
    items = wl.examples("train", 24)
    perturbed = [ex for ex in items if ex.meta["perturbed"]]
    assert 6 <= len(perturbed) <= 18
    plain = get_workload("driving", size=(112, 56)).examples("train", 24)
    moved = 0
    for ex, base in zip(items, plain):
        if not ex.meta["perturbed"]:
            assert np.allclose(ex.meta["future"], base.meta["future"]) and ex.target == base.target
            continue
        moved += np.abs(ex.meta["history"] - base.meta["history"]).max() > 0.1
    assert moved >= len(perturbed) - 1
    again = get_workload("driving", perturb=0.5, size=(112, 56)).examples("train", 24)
    assert all(np.array_equal(a.meta["future"], b.meta["future"]) for a, b in zip(items, again))
    with pytest.raises(Exception, match="perturb"):
        get_workload("driving", perturb=1.5)
    scn = make_scenario(seed_for("driving", "train", 3), "cruise")
    sim = simulate(scn, 8.0, perturbed_expert(10, 30, 1.0, 0.02))
    offset = [abs(scn.road.project(*sim.ego[k][:2])[1]) for k in (30, sim.ticks - 1)]
    assert offset[0] > 0.8 and offset[1] < 0.1  # drifted by the perturbation, then brought back


def test_tail_lamps_light_up_when_the_lead_brakes():
    """Braking is visible in the frames (lit lamps), not only in the slowly closing gap; the label render
    still shows the car as one class."""
    scn = make_scenario(seed_for("driving", "test", 5), "lead_brake")
    sim = simulate(scn, 6.0)
    t_event = int(scn.lead["t_event"] / DT)

    def count(k, rgb):
        return int((np.asarray(render_frame(sim, k)) == rgb).all(-1).sum())

    before, after = t_event - 2, t_event + 5
    assert count(before, (255, 90, 90)) == 0 and count(before, (90, 15, 15)) > 0
    assert count(after, (255, 90, 90)) > 0
    lamps = (np.asarray(render_frame(sim, after)) == (255, 90, 90)).all(-1)
    labels = np.asarray(render_frame(sim, after, labels=True))
    assert (labels[lamps] == LABELS.index("vehicle")).all()


def test_road_ahead_measures_offset_and_the_bend_in_the_ego_frame():
    """On a straight road the centreline ahead sits at minus the ego's lateral offset; on a left bend it
    moves left (positive y) the further ahead one looks; items with labels carry it."""
    straight = Scenario("cruise", Road.from_pieces([(400.0, 0.0)]), ego_speed=10.0, desired_speed=10.0)
    sim = simulate(straight, 3.0, perturbed_expert(0, 10, 0.0, 0.02))  # steer left for 1 s, then recover
    k = 10
    offset = straight.road.project(*sim.ego[k][:2])[1]
    ahead = road_ahead(sim, k, distances=(0.0,))
    assert offset > 0.2 and ahead[0] == pytest.approx(-offset, abs=0.01)
    bend = Scenario("cruise", Road.from_pieces([(400.0, 0.02)]), ego_speed=10.0, desired_speed=10.0)
    ahead = road_ahead(simulate(bend, 1.0), 5)
    assert list(ahead) == sorted(ahead) and ahead[-1] == pytest.approx(0.5 * 0.02 * 30.0 ** 2, rel=0.25)
    ex = get_workload("driving", labels=True, size=(112, 56)).example("train", 0)
    assert ex.meta["road_ahead"].shape == (len(LOOKAHEAD_M),)
