"""A deterministic, seeded road world for the driving VLA: scenarios, an expert driver, a front camera.

Why: the driving speculative methods (FlashDrive's streaming KV reuse, reasoning drafters, a cached
flow-matching head) are only measurable on a driving VLA whose reasoning is right or wrong and whose
trajectories can be scored, and no real logs or weights can be downloaded here. This world supplies both:
every scenario is a pure function of ``(seed, split, index)``; the ground truth (the expert's future
trajectory and a chain-of-causation sentence derived by rules from the world state) is exact.

The world, in SI units on a flat ground plane (x forward at the start, y to the left):

* a two-lane road whose centreline is a chain of straight and constant-curvature pieces; the ego lane is
  the right one (offset 0), the left lane is at +3.5 m;
* agents: a lead vehicle that cruises, brakes, or cuts in from the left lane; parked cars on the right
  shoulder; a pedestrian crossing at a zebra; a traffic light with a stop line (green, yellow, red);
* the ego car is a unicycle (``x' = v cos(yaw)``, ``y' = v sin(yaw)``, ``yaw' = v * curvature``,
  ``v' = accel``), the action space Alpamayo's trajectory decoder uses, driven by an expert (IDM for speed
  behind the governing obstacle, pure pursuit for the lane) at 10 Hz;
* a pinhole front camera (optionally left/right ones) renders each tick with Pillow.

Example:
    >>> scn = make_scenario(seed_for("driving", "test", 0))
    >>> sim = simulate(scn, seconds=1.0)
    >>> len(sim.ego), sim.ego[0].shape
    (11, (4,))
    >>> render_frame(sim, 5).size
    (224, 112)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from mmspec.workloads import seed_for

__all__ = ["Road", "Scenario", "SimResult", "Hazard", "make_scenario", "simulate", "render_frame", "hazard_at",
           "reasoning_text", "to_ego_frame", "scenario_for", "safety_events", "SCENARIO_KINDS", "LABELS", "DT",
           "LANE_WIDTH", "CAMERAS", "perturbed_expert", "road_ahead", "LOOKAHEAD_M", "INCIDENTS", "any_incident"]

DT = 0.1  # 10 Hz, as the driving VLAs tick
LANE_WIDTH = 3.5
MAX_CURVATURE = 0.2  # 1/m: the expert's steering limit (a 5 m turning radius)
SCENARIO_KINDS = ("cruise", "lead_brake", "cut_in", "red_light", "pedestrian", "parked")
CAMERAS = {"front": 0.0, "left": math.radians(55), "right": -math.radians(55)}  # yaw offsets
CAR_LEN, CAR_WID, CAR_H = 4.5, 1.9, 1.5
# Class ids of render_frame(..., labels=True): what each pixel shows (dense supervision for a vision tower).
LABELS = ("sky", "grass", "road", "marking", "vehicle", "parked", "pedestrian", "light_red", "light_yellow",
          "light_green", "light_pole")
PED_WID, PED_H = 0.6, 1.75


@dataclass
class Road:
    """A centreline sampled every ``step`` metres: arc length ``s``, position ``xy[n, 2]``, heading ``psi``."""

    s: np.ndarray
    xy: np.ndarray
    psi: np.ndarray
    step: float = 0.5

    @classmethod
    def from_pieces(cls, pieces, step: float = 0.5) -> "Road":
        """``pieces``: ``[(length_m, curvature_1_per_m), ...]`` chained from the origin heading +x.

        Example:
            >>> r = Road.from_pieces([(10.0, 0.0)])
            >>> r.pose(4.0)
            (4.0, 0.0, 0.0)
        """
        xs, ys, ps = [0.0], [0.0], [0.0]
        for length, curv in pieces:
            for _ in range(int(round(length / step))):
                p = ps[-1]
                xs.append(xs[-1] + step * math.cos(p + curv * step / 2))
                ys.append(ys[-1] + step * math.sin(p + curv * step / 2))
                ps.append(p + curv * step)
        n = len(xs)
        return cls(np.arange(n) * step, np.stack([xs, ys], 1), np.array(ps), step)

    def pose(self, s: float, offset: float = 0.0) -> tuple[float, float, float]:
        """World ``(x, y, heading)`` at arc length ``s``, ``offset`` metres to the left of the centreline."""
        i = min(max(int(s / self.step), 0), len(self.s) - 2)
        t = min(max((s - self.s[i]) / self.step, 0.0), 1.0)
        x, y = (1 - t) * self.xy[i] + t * self.xy[i + 1]
        psi = (1 - t) * self.psi[i] + t * self.psi[i + 1]
        return float(x - offset * math.sin(psi)), float(y + offset * math.cos(psi)), float(psi)

    def project(self, x: float, y: float, hint: float | None = None) -> tuple[float, float]:
        """``(s, lateral offset)`` of a world point (nearest centreline sample, searched near ``hint``)."""
        if hint is None:
            lo, hi = 0, len(self.s)
        else:
            c = int(hint / self.step)
            lo, hi = max(0, c - 40), min(len(self.s), c + 40)
        d = self.xy[lo:hi] - np.array([x, y])
        i = lo + int(np.argmin((d ** 2).sum(1)))
        psi = self.psi[i]
        dx, dy = x - self.xy[i, 0], y - self.xy[i, 1]
        along = dx * math.cos(psi) + dy * math.sin(psi)
        return float(self.s[i] + along), float(-dx * math.sin(psi) + dy * math.cos(psi))


@dataclass
class Scenario:
    """Everything that varies between clips (drawn by :func:`make_scenario`)."""

    kind: str
    road: Road
    ego_speed: float
    desired_speed: float
    lead: dict | None = None  # s0, speed, behaviour ("cruise" | "brake" | "cut_in"), t_event, decel
    parked: list = field(default_factory=list)  # s positions on the right shoulder
    pedestrian: dict | None = None  # s (crossing), t_start, speed
    light: dict | None = None  # s (stop line), phases: list of (colour, seconds), offset
    colors: dict = field(default_factory=dict)


@dataclass
class SimResult:
    """One simulated clip: per tick ``ego[t] = (x, y, yaw, v)``, the agents' states, the road, and the
    ``controls[t] = (accel, curvature)`` applied from tick ``t`` to ``t + 1`` (one fewer than ticks)."""

    scenario: Scenario
    ego: list
    agents: list  # per tick: list of dicts (kind, x, y, yaw, length, width, height, color, ...)
    light_color: list  # per tick: "green" | "yellow" | "red" | None
    ego_s: list  # per tick: ego arc length along the road
    controls: list = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return len(self.ego)


def make_scenario(seed: int, kind: str | None = None) -> Scenario:
    """A random scenario (``kind`` forces one of :data:`SCENARIO_KINDS`).

    Example:
        >>> make_scenario(7, "red_light").light["s"] > 0
        True
    """
    rng = np.random.default_rng(seed)
    kind = kind or SCENARIO_KINDS[int(rng.integers(len(SCENARIO_KINDS)))]
    pieces = [(float(rng.uniform(20, 40)), 0.0)]
    for _ in range(6):  # at least 260 m: 12 s at the top speed, plus the 70 m the camera sees
        curv = 0.0 if rng.random() < 0.4 else float(rng.choice([-1, 1]) / rng.uniform(60, 200))
        pieces.append((float(rng.uniform(40, 90)), curv))
    road = Road.from_pieces(pieces)
    v0 = float(rng.uniform(7, 13))
    scn = Scenario(kind=kind, road=road, ego_speed=v0, desired_speed=float(min(14.0, v0 + rng.uniform(0, 2))))
    palette = [(200, 40, 40), (40, 80, 200), (230, 230, 230), (30, 30, 30), (220, 180, 30), (60, 150, 60)]
    scn.colors = {"lead": palette[int(rng.integers(len(palette)))]}
    if kind in ("cruise", "lead_brake", "cut_in"):
        behaviour = {"cruise": "cruise", "lead_brake": "brake", "cut_in": "cut_in"}[kind]
        scn.lead = {"s0": float(rng.uniform(18, 35) if kind != "cut_in" else rng.uniform(12, 22)),
                    "speed": float(v0 * rng.uniform(0.75, 1.0)), "behaviour": behaviour,
                    "t_event": float(rng.uniform(1.5, 3.0)), "decel": float(rng.uniform(2.5, 5.0))}
        if kind == "cut_in":
            # A cut-in starts at least 0.8 s of headway ahead of a nominal ego (no one can avoid a car that
            # swerves in at 2 m): the ego closes (v0 - v_lead) * t_event before the manoeuvre.
            ld, vd = scn.lead, scn.desired_speed  # the ego may speed up towards vd meanwhile
            gap_at_event = ld["s0"] - (vd - ld["speed"]) * ld["t_event"] - CAR_LEN
            ld["s0"] += max(0.0, max(8.0, 0.8 * vd) - gap_at_event)
        if kind == "cruise" and rng.random() < 0.4:
            scn.lead = None  # an empty road
    if kind == "parked" or rng.random() < 0.3:
        scn.parked = sorted(float(s) for s in rng.uniform(20, 90, size=int(rng.integers(1, 4))))
    if kind == "pedestrian":
        ped = {"s": float(rng.uniform(35, 70)), "t_start": float(rng.uniform(0.0, 2.5)),
               "speed": float(rng.uniform(1.0, 1.6))}
        # The pedestrian reaches the ego lane's edge (offset -2.6 m) only when a nominal ego (at its desired
        # speed) is still a comfortable stop (3 m/s^2) plus 8 m away: the expert can always yield.
        vd = scn.desired_speed
        reach = (5.0 - 2.6) / ped["speed"]
        latest = (ped["s"] - 8.0 - vd * vd / 6.0) / vd - reach
        if latest < 0:
            ped["s"] += -latest * vd
            latest = 0.0
        ped["t_start"] = min(ped["t_start"], latest)
        scn.pedestrian = ped
    if kind == "red_light":
        green = float(rng.uniform(1.0, 2.5))
        scn.light = {"s": float(rng.uniform(30, 50)), "phases": [("green", green), ("yellow", 2.0), ("red", 30.0)],
                     "offset": 0.0}
    return scn


def _light_color(light: dict, t: float) -> str:
    acc = 0.0
    for color, dur in light["phases"]:
        acc += dur
        if t + light["offset"] < acc:
            return color
    return light["phases"][-1][0]


def _lead_state(scn: Scenario, t: float) -> tuple[float, float, float]:
    """Lead vehicle ``(s, lateral offset, speed)`` at time ``t`` (closed form: scripted behaviours)."""
    ld = scn.lead
    v, te = ld["speed"], ld["t_event"]
    if ld["behaviour"] == "brake" and t > te:
        dt = t - te
        t_stop = v / ld["decel"]
        if dt < t_stop:
            return ld["s0"] + v * te + v * dt - 0.5 * ld["decel"] * dt * dt, 0.0, v - ld["decel"] * dt
        return ld["s0"] + v * te + v * t_stop / 2, 0.0, 0.0
    s = ld["s0"] + v * t
    if ld["behaviour"] == "cut_in":
        frac = min(max((t - te) / 2.5, 0.0), 1.0)
        return s, LANE_WIDTH * (1 - (3 * frac ** 2 - 2 * frac ** 3)), v
    return s, 0.0, v


def _pedestrian_offset(scn: Scenario, t: float) -> float | None:
    p = scn.pedestrian
    if t < p["t_start"]:
        return -5.0
    off = -5.0 + p["speed"] * (t - p["t_start"])
    return off if off < LANE_WIDTH + 5.0 else None


def _obstacles(scn: Scenario, t: float) -> list:
    """Obstacles the expert must respect in the ego lane: ``(s, speed)`` (stationary for stops)."""
    obs = []
    if scn.lead is not None:
        s, off, v = _lead_state(scn, t)
        # A car signalling and drifting in is yielded to from the start of its manoeuvre, as drivers do.
        cutting = scn.lead["behaviour"] == "cut_in" and t >= scn.lead["t_event"]
        if abs(off) < LANE_WIDTH * 0.75 or cutting:
            obs.append((s - CAR_LEN, v))
    if scn.pedestrian is not None:
        off = _pedestrian_offset(scn, t)
        if off is not None and -2.6 < off < LANE_WIDTH / 2 + 0.8:
            obs.append((scn.pedestrian["s"] - 2.0, 0.0))
    if scn.light is not None:
        if _light_color(scn.light, t) in ("yellow", "red"):
            obs.append((scn.light["s"], 0.0))
    return obs


def _idm(v: float, v0: float, gap: float | None, v_lead: float) -> float:
    a_max, b, s0, T = 2.0, 3.0, 3.0, 1.2
    acc = a_max * (1 - (v / max(v0, 0.1)) ** 4)
    if gap is not None:
        s_star = s0 + max(0.0, v * T + v * (v - v_lead) / (2 * math.sqrt(a_max * b)))
        acc -= a_max * (s_star / max(gap, 0.1)) ** 2
    return max(-8.0, min(a_max, acc))


def simulate(scn: Scenario, seconds: float, policy=None) -> SimResult:
    """Run the world for ``seconds`` at :data:`DT`; the ego follows ``policy`` or the expert.

    ``policy(sim_so_far, tick) -> (accel, curvature)`` (closed loop: a model drives), or ``None`` for the
    expert; a policy may return ``None`` to let the expert drive that tick (a warm-up before hand-over).
    Stops early if the ego leaves the road's sampled length.
    """
    road = scn.road
    x, y, yaw = road.pose(0.0)
    v = scn.ego_speed
    ego, agents, lights, ego_s = [], [], [], []
    s_hint = 0.0
    res = SimResult(scn, ego, agents, lights, ego_s)
    n = int(round(seconds / DT)) + 1
    for k in range(n):
        t = k * DT
        s_ego, _ = road.project(x, y, s_hint)
        s_hint = s_ego
        ego.append(np.array([x, y, yaw, v]))
        ego_s.append(s_ego)
        agents.append(_agents_at(scn, t))
        lights.append(_light_color(scn.light, t) if scn.light else None)
        if k == n - 1 or s_ego > road.s[-1] - 80:
            break
        action = None if policy is None else policy(res, k)
        acc, curv = _expert(scn, t, x, y, yaw, v, s_ego) if action is None else action
        res.controls.append((float(acc), float(curv)))
        x += v * math.cos(yaw) * DT
        y += v * math.sin(yaw) * DT
        yaw += v * curv * DT
        v = max(0.0, v + acc * DT)
    return res


def _expert(scn: Scenario, t: float, x, y, yaw, v, s_ego) -> tuple[float, float]:
    road = scn.road
    ahead = [(s - s_ego, vl) for s, vl in _obstacles(scn, t) if s - s_ego > -1.0]
    gap, v_lead = min(ahead) if ahead else (None, 0.0)
    if scn.light is not None and gap is not None and _light_color(scn.light, t) == "yellow":
        d = scn.light["s"] - s_ego  # a yellow too close to stop for is driven through
        if 0 < d < v * v / (2 * 4.0):
            rest = [(s - s_ego, vl) for s, vl in _obstacles(scn, t) if s != scn.light["s"] and s - s_ego > -1.0]
            gap, v_lead = min(rest) if rest else (None, 0.0)
    acc = _idm(v, scn.desired_speed, gap, v_lead)
    look = max(6.0, 1.2 * v)
    tx, ty, _ = road.pose(s_ego + look)
    dx, dy = tx - x, ty - y
    lat = -dx * math.sin(yaw) + dy * math.cos(yaw)
    curv = 2 * lat / max(dx * dx + dy * dy, 1e-3)
    return acc, max(-MAX_CURVATURE, min(MAX_CURVATURE, curv))


LOOKAHEAD_M = (5.0, 10.0, 20.0, 30.0)


def road_ahead(sim: SimResult, tick: int, distances=LOOKAHEAD_M) -> np.ndarray:
    """Where the centre of the ego's lane (the line the expert tracks) lies ``distances`` metres ahead (along the
    road) of the ego at ``tick``: its lateral position in the ego frame (metres, left positive), one per distance.

    Why: these numbers fold the ego's lateral offset, heading error and the road's curvature into what a
    steering controller needs (the expert steers for the point ``max(6, 1.2 v)`` m ahead); a VLA is trained to
    read them from its frames (an auxiliary loss), so lane geometry is explicit in its states.

    Example:
        >>> scn = make_scenario(seed_for("driving", "train", 3), "cruise")
        >>> road_ahead(simulate(scn, 1.0), 0).shape
        (4,)
    """
    pose = sim.ego[tick]
    pts = np.array([sim.scenario.road.pose(sim.ego_s[tick] + d)[:2] for d in distances])
    return to_ego_frame(pts, pose)[:, 1].astype(np.float32)


def perturbed_expert(start: int, stop: int, accel_offset: float, curvature_offset: float):
    """A ``simulate`` policy: the expert with constant offsets added to its acceleration and curvature on
    ticks ``start <= k < stop``, and the expert alone elsewhere.

    Why: a policy learnt only from the expert's own states never sees itself off the lane centre or too fast,
    so in closed loop its small errors compound (the covariate shift DAgger and ChauffeurNet's trajectory
    perturbations answer). Samples cut at ``stop`` show a perturbed history and the expert's recovery.

    Example:
        >>> scn = make_scenario(seed_for("driving", "train", 3), "cruise")
        >>> sim = simulate(scn, 3.0, perturbed_expert(5, 25, 0.0, 0.01))
        >>> abs(scn.road.project(*sim.ego[25][:2])[1]) > abs(scn.road.project(*sim.ego[5][:2])[1])
        True
    """
    def policy(sim: SimResult, k: int):
        if not start <= k < stop:
            return None
        x, y, yaw, v = sim.ego[k]
        acc, curv = _expert(sim.scenario, k * DT, x, y, yaw, v, sim.ego_s[k])
        return acc + accel_offset, max(-MAX_CURVATURE, min(MAX_CURVATURE, curv + curvature_offset))

    return policy


INCIDENTS = ("collision", "offroad", "red_light")


def any_incident(events: dict) -> bool:
    """Whether :func:`safety_events` found a collision, a road departure or a red light run.

    Example:
        >>> any_incident({"collision": False, "offroad": True, "red_light": False, "progress_m": 3.0})
        True
    """
    return any(bool(events[k]) for k in INCIDENTS)


def safety_events(sim: SimResult, from_tick: int = 0) -> dict:
    """Did the ego collide (its box overlapping an agent's, in road coordinates), leave the road (centre past
    the road edges by 0.5 m) or run a red light, from ``from_tick`` on? Plus ``progress_m``.

    Example:
        >>> safety_events(simulate(make_scenario(2, "lead_brake"), seconds=6.0))["collision"]
        False
    """
    road, scn = sim.scenario.road, sim.scenario
    collision = offroad = red = False
    for k in range(from_tick, sim.ticks):
        x, y = sim.ego[k][0], sim.ego[k][1]
        s, off = road.project(x, y, sim.ego_s[k])
        offroad |= off < -LANE_WIDTH / 2 - 0.5 or off > LANE_WIDTH * 1.5 + 0.5
        for a in sim.agents[k]:
            if abs(a["s"] - s) < (CAR_LEN + a["length"]) / 2 and abs(a["offset"] - off) < (CAR_WID + a["width"]) / 2:
                collision = True
        if scn.light is not None and k > 0 and sim.light_color[k] == "red":
            red |= sim.ego_s[k - 1] < scn.light["s"] <= sim.ego_s[k]
    return {"collision": collision, "offroad": offroad, "red_light": red,
            "progress_m": float(sim.ego_s[-1] - sim.ego_s[from_tick])}


def _agents_at(scn: Scenario, t: float) -> list:
    road = scn.road
    out = []
    if scn.lead is not None:
        s, off, v = _lead_state(scn, t)
        x, y, psi = road.pose(s, off)
        out.append({"kind": "lead", "x": x, "y": y, "yaw": psi, "length": CAR_LEN, "width": CAR_WID,
                    "height": CAR_H, "color": scn.colors.get("lead", (200, 40, 40)), "s": s, "offset": off,
                    "speed": v, "braking": scn.lead["behaviour"] == "brake" and t > scn.lead["t_event"]})
    for s in scn.parked:
        x, y, psi = road.pose(s, -2.9)
        out.append({"kind": "parked", "x": x, "y": y, "yaw": psi, "length": CAR_LEN, "width": CAR_WID,
                    "height": CAR_H, "color": (120, 120, 130), "s": s, "offset": -2.9, "speed": 0.0,
                    "braking": False})
    if scn.pedestrian is not None:
        off = _pedestrian_offset(scn, t)
        if off is not None:
            x, y, psi = road.pose(scn.pedestrian["s"], off)
            out.append({"kind": "pedestrian", "x": x, "y": y, "yaw": psi, "length": 0.5, "width": PED_WID,
                        "height": PED_H, "color": (240, 120, 20), "s": scn.pedestrian["s"], "offset": off,
                        "speed": scn.pedestrian["speed"]})
    return out


# ---------------------------------------------------------------------------- ground truth
@dataclass
class Hazard:
    """What governs the ego at a tick: ``kind`` (``lead_braking``, ``lead``, ``cut_in``, ``red_light``,
    ``yellow_light``, ``pedestrian``, ``parked``, ``clear``), its distance ahead in metres, the action."""

    kind: str
    distance: int | None
    action: str


def hazard_at(sim: SimResult, tick: int) -> Hazard:
    """The rule-derived hazard at ``tick`` (the nearest thing within 50 m the expert reacts to).

    Example:
        >>> sim = simulate(make_scenario(3, "red_light"), seconds=4.0)
        >>> hazard_at(sim, 30).kind in ("red_light", "yellow_light", "clear")
        True
    """
    scn, t = sim.scenario, tick * DT
    s_ego = sim.ego_s[tick]
    cands = []
    if scn.lead is not None:
        s, off, v = _lead_state(scn, t)
        d = s - CAR_LEN - s_ego
        if 0 < d < 50:
            if scn.lead["behaviour"] == "cut_in" and LANE_WIDTH * 0.05 < off < LANE_WIDTH * 0.95 and t >= scn.lead["t_event"]:
                cands.append((d, "cut_in", "slow down and keep lane"))
            elif abs(off) < LANE_WIDTH * 0.5:
                braking = scn.lead["behaviour"] == "brake" and t > scn.lead["t_event"] and v > 0.0
                stopped = scn.lead["behaviour"] == "brake" and v == 0.0
                if braking:
                    cands.append((d, "lead_braking", "slow down and keep lane"))
                elif stopped:
                    cands.append((d, "lead_stopped", "stop behind it"))
                else:
                    cands.append((d, "lead", "follow and keep lane"))
    if scn.pedestrian is not None:
        off = _pedestrian_offset(scn, t)
        d = scn.pedestrian["s"] - s_ego
        if off is not None and -2.6 < off < LANE_WIDTH / 2 + 0.8 and 0 < d < 50:
            cands.append((d, "pedestrian", "yield and stop"))
    if scn.light is not None:
        color = _light_color(scn.light, t)
        d = scn.light["s"] - s_ego
        if color != "green" and 0 < d < 50:
            cands.append((d, f"{color}_light", "stop at the line"))
    if cands:
        d, kind, action = min(cands)
        return Hazard(kind, int(round(d)), action)
    for s in scn.parked:
        d = s - s_ego
        if 0 < d < 30:
            return Hazard("parked", int(round(d)), "keep lane and pass")
    return Hazard("clear", None, "keep speed and lane")


_PHRASES = {"lead_braking": "lead vehicle braking", "lead_stopped": "lead vehicle stopped", "lead": "lead vehicle",
            "cut_in": "vehicle cutting in from the left", "red_light": "red light",
            "yellow_light": "yellow light", "pedestrian": "pedestrian crossing", "parked": "parked car on the right"}


def reasoning_text(h: Hazard) -> str:
    """The chain-of-causation sentence for a hazard (what the VLA must write).

    Example:
        >>> reasoning_text(Hazard("lead_braking", 12, "slow down and keep lane"))
        'Lead vehicle braking 12 m ahead; slow down and keep lane.'
        >>> reasoning_text(Hazard("clear", None, "keep speed and lane"))
        'Road clear; keep speed and lane.'
    """
    if h.kind == "clear":
        return f"Road clear; {h.action}."
    text = f"{_PHRASES[h.kind]} {h.distance} m ahead; {h.action}."
    return text[0].upper() + text[1:]


def to_ego_frame(points: np.ndarray, pose) -> np.ndarray:
    """World ``points[n, 2]`` in the frame of ``pose = (x, y, yaw, ...)``: x forward, y left.

    Example:
        >>> to_ego_frame(np.array([[1.0, 1.0]]), (1.0, 0.0, math.pi / 2)).round(6).tolist()
        [[1.0, 0.0]]
    """
    x, y, yaw = pose[0], pose[1], pose[2]
    d = np.asarray(points, dtype=np.float64)[:, :2] - np.array([x, y])
    c, s = math.cos(yaw), math.sin(yaw)
    return np.stack([d[:, 0] * c + d[:, 1] * s, -d[:, 0] * s + d[:, 1] * c], 1)


# ---------------------------------------------------------------------------- camera
def _project(pts_cam: np.ndarray, f: float, cx: float, cy: float, cam_h: float):
    """Camera-frame points ``[n, 3]`` (forward, left, up) -> pixel ``[n, 2]``; ``None`` rows behind."""
    X, Y, Z = pts_cam[:, 0], pts_cam[:, 1], pts_cam[:, 2]
    ok = X > 0.3
    u = cx - f * Y / np.maximum(X, 0.3)
    v = cy + f * (cam_h - Z) / np.maximum(X, 0.3)
    return np.stack([u, v], 1), ok


def render_frame(sim: SimResult, tick: int, camera: str = "front", size=(224, 112), fov_deg: float = 90.0,
                 labels: bool = False) -> Image.Image:
    """The camera image at ``tick``: sky, grass, road with lane marks, stop line and zebra, vehicles,
    the pedestrian and the traffic light, by painter's order (far first). With ``labels`` the same drawing
    in class ids (an ``"L"`` image indexing :data:`LABELS`).

    Example:
        >>> sim = simulate(make_scenario(1, "pedestrian"), seconds=0.5)
        >>> render_frame(sim, 0, camera="left").mode
        'RGB'
    """
    W, H = size
    f = (W / 2) / math.tan(math.radians(fov_deg) / 2)
    cx, cy, cam_h = W / 2, H * 0.45, 1.5
    x, y, yaw, _ = sim.ego[tick]
    yaw_c = yaw + CAMERAS[camera]
    ids = {name: i for i, name in enumerate(LABELS)}

    def paint(name, rgb):
        return ids[name] if labels else rgb

    img = Image.new("L" if labels else "RGB", (W, H), paint("sky", (150, 190, 235)))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, int(cy), W, H], fill=paint("grass", (90, 140, 70)))
    road, scn = sim.scenario.road, sim.scenario
    c, s = math.cos(yaw_c), math.sin(yaw_c)

    def cam(points3):
        p = np.asarray(points3, dtype=np.float64)
        dx, dy = p[:, 0] - x, p[:, 1] - y
        return np.stack([dx * c + dy * s, -dx * s + dy * c, p[:, 2]], 1)

    def ground_poly(pts2):
        uv, ok = _project(cam(np.c_[pts2, np.zeros(len(pts2))]), f, cx, cy, cam_h)
        return [tuple(p) for p in uv[ok]]

    s0 = sim.ego_s[tick]
    ss = np.arange(max(0.0, s0 - 10), min(road.s[-1], s0 + 70), 1.0)
    if len(ss) >= 2:
        left = np.array([road.pose(t, LANE_WIDTH * 1.5)[:2] for t in ss])
        right = np.array([road.pose(t, -LANE_WIDTH / 2)[:2] for t in ss])
        for a in range(len(ss) - 1, 0, -1):  # far to near
            quad = ground_poly(np.array([left[a], left[a - 1], right[a - 1], right[a]]))
            if len(quad) >= 3:
                draw.polygon(quad, fill=paint("road", (70, 70, 75)))
        for t0 in ss[::2]:  # dashed centre line
            seg = ground_poly(np.array([road.pose(t0, LANE_WIDTH / 2)[:2], road.pose(t0 + 1.0, LANE_WIDTH / 2)[:2]]))
            if len(seg) == 2:
                draw.line(seg, fill=paint("marking", (240, 240, 240)), width=1)
        for off in (-LANE_WIDTH / 2 + 0.1, LANE_WIDTH * 1.5 - 0.1):
            line = ground_poly(np.array([road.pose(t0, off)[:2] for t0 in ss]))
            if len(line) >= 2:
                draw.line(line, fill=paint("marking", (235, 235, 235)), width=1)
    if scn.light is not None:
        sl = scn.light["s"]
        line = ground_poly(np.array([road.pose(sl, o)[:2] for o in (-LANE_WIDTH / 2, LANE_WIDTH / 2)]))
        if len(line) == 2:
            draw.line(line, fill=paint("marking", (255, 255, 255)), width=2)
    if scn.pedestrian is not None:
        sp = scn.pedestrian["s"]
        for o in np.arange(-LANE_WIDTH / 2 + 0.3, LANE_WIDTH * 1.5, 0.9):
            quad = ground_poly(np.array([road.pose(sp - 1.5, o)[:2], road.pose(sp + 1.5, o)[:2],
                                         road.pose(sp + 1.5, o + 0.45)[:2], road.pose(sp - 1.5, o + 0.45)[:2]]))
            if len(quad) >= 3:
                draw.polygon(quad, fill=paint("marking", (225, 225, 225)))
    boxes = list(sim.agents[tick])
    if scn.light is not None:
        lx, ly, lpsi = road.pose(scn.light["s"], -LANE_WIDTH / 2 - 0.8)
        light = sim.light_color[tick]
        color = {"green": (40, 220, 60), "yellow": (250, 200, 20), "red": (240, 30, 30)}[light]
        boxes.append({"kind": "light", "x": lx, "y": ly, "yaw": lpsi, "length": 0.4, "width": 0.4, "height": 4.2,
                      "color": paint(f"light_{light}", color)})
    for b in sorted(boxes, key=lambda b: -((b["x"] - x) ** 2 + (b["y"] - y) ** 2)):
        if labels and b["kind"] != "light":
            b = dict(b, color=ids["vehicle" if b["kind"] == "lead" else b["kind"]])
        _draw_box(draw, b, cam, f, cx, cy, cam_h, paint)
    return img


def _draw_box(draw, b, cam, f, cx, cy, cam_h, paint):
    cb, sb = math.cos(b["yaw"]), math.sin(b["yaw"])
    hl, hw = b["length"] / 2, b["width"] / 2
    corners = [(b["x"] + dx * cb - dy * sb, b["y"] + dx * sb + dy * cb) for dx, dy in
               ((hl, hw), (hl, -hw), (-hl, -hw), (-hl, hw))]
    z0 = 2.8 if b["kind"] == "light" else 0.0
    pts = cam([(px, py, z) for px, py in corners for z in (z0, b["height"])])
    if (pts[:, 0] <= 0.3).any():
        return
    uv, _ = _project(pts, f, cx, cy, cam_h)
    u0, v0 = uv.min(0)
    u1, v1 = uv.max(0)
    if u1 < 0 or u0 > 2 * cx or v1 < 0:
        return
    if b["kind"] == "light":
        pole = cam([(b["x"], b["y"], 0.0), (b["x"], b["y"], z0)])
        puv, _ = _project(pole, f, cx, cy, cam_h)
        draw.line([tuple(puv[0]), tuple(puv[1])], fill=paint("light_pole", (40, 40, 40)), width=1)
        draw.rectangle([u0, v0, max(u1, u0 + 1), max(v1, v0 + 1)], fill=paint("light_pole", (25, 25, 25)))
        r = max(1.0, (u1 - u0) / 2)
        mid = (u0 + u1) / 2
        draw.ellipse([mid - r, v0 + r * 0.2, mid + r, v0 + r * 2.2], fill=b["color"])
        return
    draw.rectangle([u0, v0, max(u1, u0 + 1), max(v1, v0 + 1)], fill=b["color"],
                   outline=b["color"] if isinstance(b["color"], int) else (20, 20, 20))
    if b["kind"] != "pedestrian" and (v1 - v0) > 6:  # a rear window, so cars read as cars
        draw.rectangle([u0 + (u1 - u0) * 0.2, v0 + (v1 - v0) * 0.12, u1 - (u1 - u0) * 0.2, v0 + (v1 - v0) * 0.45],
                       fill=b["color"] if isinstance(b["color"], int) else (150, 190, 220))
    if "braking" in b:
        # Tail lamps, lit while braking (and once stopped): what tells a driver the car ahead is braking
        # before the gap visibly closes. Drawn on the box's screen rectangle (the rear as the front camera
        # sees it; side cameras see them on the flank). Label renders keep the car's class.
        label = isinstance(b["color"], int)
        lit = (255, 90, 90) if b["braking"] else (90, 15, 15)
        w, h = max(1.0, (u1 - u0) * 0.2), max(1.0, (v1 - v0) * 0.16)
        top = v0 + (v1 - v0) * 0.55
        for left in (u0 + (u1 - u0) * 0.04, u1 - (u1 - u0) * 0.04 - w):
            draw.rectangle([left, top, left + w, top + h], fill=b["color"] if label else lit,
                           outline=None if label or w < 4 else (25, 25, 25))


def scenario_for(split: str, index: int, seed: int = 0, kind: str | None = None) -> Scenario:
    """The scenario of item ``index`` of ``split`` (SHA-256 seeded, as every workload item)."""
    return make_scenario(seed_for("driving", split, index, seed), kind)
