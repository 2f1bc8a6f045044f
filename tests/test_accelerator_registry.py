"""Adding an accelerator is one `Accelerator` subclass and one registry line. Shown with a toy card
registered from this test alone (a CPU-backed fake, as a second vendor would be on a machine
without its cards): option validation, detection and `auto`, the card actor's open and describe,
the run's dtype labels, placement options and `harness info` all take it without other edits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.policy_actor import PolicyActor
from harness import devices
from harness.cli.info import print_accelerator
from harness.devices.base import Accelerator, Detection
from harness.devices.precision import Switch
from harness.errors import UsageError
from harness.policies import PolicySpec, load_policy
from harness.config.command_plan import sweep_plan
from harness.config.fields import Given, config_from
from harness.config.options import SweepConfig, validate
from harness.cluster.place import card_options
from harness.sweeps.driver import dtype_labels
from harness.sweeps.resolve import Cards, check_cards, planned_cards
from harness.workloads import make_batch


class ToyLibrary:
    """What a vendor's torch extension would hold: a card count and a reduced-float32 switch."""

    plugged_in = True
    allow_low_precision = True  # as the vendor ships it: float32 matmuls in bf16
    synchronized = 0


class Toy(Accelerator):
    display = "a toy"
    ray_resource = "TOY"

    def _detect(self) -> Detection:
        return Detection(True, "") if ToyLibrary.plugged_in else Detection(False, "the toy card is unplugged")

    def select(self) -> str:
        return "Toy Card 1"

    def torch_device(self) -> str:
        return "cpu"  # the toy computes on the CPU

    def synchronize(self) -> None:
        ToyLibrary.synchronized += 1

    def switches(self) -> tuple[Switch, ...]:
        def make_strict() -> None:
            ToyLibrary.allow_low_precision = False

        return (Switch("toy.allow_low_precision", False, lambda: ToyLibrary.allow_low_precision, make_strict),)

    def reduced_float32_matmul(self, settings: dict[str, object]) -> str | None:
        return "bf16" if settings.get("toy.allow_low_precision") is True else None

    def cards(self) -> list[str]:
        return ["Toy Card 1", "Toy Card 1"]


@pytest.fixture
def toy() -> object:
    ToyLibrary.plugged_in, ToyLibrary.allow_low_precision = True, True
    with devices.registered("toy", Toy) as kind:
        yield kind


def test_a_registered_accelerator_is_a_choice_and_auto_tries_it_before_simulated_cards(toy: devices.Kind) -> None:
    assert devices.choices() == ("auto", "npu", "cuda", "toy", "cpu")
    assert devices.as_kind("toy") == toy
    with pytest.raises(UsageError, match=r"--accelerator 'tyo' is not one of auto, npu, cuda, toy, cpu; did you mean 'toy'\?"):
        devices.as_kind("tyo")
    if not any(devices.accelerator(k).detect().available for k in ("npu", "cuda")):
        assert devices.resolve_accelerator("auto") == "toy"
        ToyLibrary.plugged_in = False
        assert devices.resolve_accelerator("auto") == devices.SIMULATED
    ToyLibrary.plugged_in = False
    with pytest.raises(UsageError, match="--accelerator toy asked for, but the toy card is unplugged; use --accelerator cpu"):
        devices.resolve_accelerator("toy")


def test_the_registry_is_put_back_and_refuses_what_is_not_an_accelerator() -> None:
    with devices.registered("toy", Toy):
        pass
    assert devices.choices() == ("auto", "npu", "cuda", "cpu")
    with pytest.raises(UsageError, match="--accelerator 'toy' is not one of auto, npu, cuda, cpu"):
        devices.accelerator("toy")
    with devices.registered("broken", "harness.errors:UsageError"):
        with pytest.raises(TypeError, match="not an Accelerator subclass"):
            devices.accelerator("broken")
    with pytest.raises(ValueError, match="other than 'auto'"):
        devices.register("auto", Toy)


def test_option_validation_takes_it(toy: devices.Kind, tmp_path: object) -> None:
    validate(config_from(SweepConfig, Given({"accelerator": "toy", "results": str(tmp_path)})))
    with pytest.raises(UsageError, match="--accelerator 'tpu' is not one of auto, npu, cuda, toy, cpu"):
        config_from(SweepConfig, Given({"accelerator": "tpu", "results": str(tmp_path)}))


def test_the_card_actor_opens_and_describes_it_and_the_run_labels_its_float32(toy: devices.Kind, tmp_path: object) -> None:
    """PolicyActor in this process (a Ray worker would build it from the same arguments)."""
    actor = PolicyActor(toy, 0, [PolicySpec("cartpole")], 1, "device-default", [], f"{tmp_path}/crash")
    described = actor.describe()
    card = described.device
    assert (card.kind, card.label, card.model, card.simulated) == (
        "toy",
        "toy0",
        "Toy Card 1",
        False,
    )
    assert card.settings == {
        "precision": "device-default",
        "set": {},
        "toy.allow_low_precision": True,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
    }
    assert dtype_labels(["float32", "bfloat16"], [described]) == {"float32": "float32-bf16", "bfloat16": "bfloat16"}

    strict = PolicyActor(toy, 1, [PolicySpec("cartpole")], 1, "strict", [], f"{tmp_path}/crash")
    described = strict.describe()
    assert described.device.settings["set"] == {"toy.allow_low_precision": False}
    assert dtype_labels(["float32"], [described]) == {"float32": "float32"}
    batch = make_batch(load_policy("cartpole").info, "normal", 8, seed=0)
    toy_out = strict.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    reference = PolicyActor(devices.SIMULATED, 0, [PolicySpec("cartpole")], 1, "strict", [], f"{tmp_path}/crash")
    cpu_out = reference.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    assert all(np.array_equal(toy_out[name], cpu_out[name]) for name in cpu_out)  # CPU-backed: the same bits
    devices.synchronize(strict.runner.device)
    assert ToyLibrary.synchronized >= 1


def test_placement_asks_ray_for_its_resource(toy: devices.Kind) -> None:
    options = card_options(toy, object(), 0, {})  # type: ignore[arg-type]  # a placement group is only passed through
    assert options["num_cpus"] == 0 and options["resources"] == {"TOY": 1}
    assert devices.accelerator(toy).local_ray_resources(2) is None  # a private local Ray counts the node's own cards
    cards = planned_cards(sweep_plan(SweepConfig(accelerator="toy")), lambda: toy)
    assert (cards.count, cards.expected) == (None, 1)  # the node's own cards: Ray will say
    asked = Cards(1000, 1000, "--cards 1000")
    check_cards(asked, toy, None)  # the per-core bound is for simulated cards only
    with pytest.raises(UsageError, match="--cards 1000: 1000 simulated cards on this machine"):
        check_cards(asked, devices.SIMULATED, None)


def test_info_shows_it(toy: devices.Kind, capsys: pytest.CaptureFixture[str]) -> None:
    local = devices.describe_local()
    assert list(local) == ["npu", "cuda", "toy", "cpu", "auto"]
    print_accelerator("toy", local["toy"])  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "toy                available: 2 card(s): Toy Card 1, Toy Card 1" in out and "toy.allow_low_precision = True" in out
