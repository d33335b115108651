"""A family's own defaults for a shared config section (`section_defaults`): one class for every family."""

from typing import Annotated

import pytest
from pydantic import Field, ValidationError

from genforge.core.config import StrictModel, section_defaults


class Shared(StrictModel):
    weight: float = Field(1.0, ge=0.0)
    kind: str = "plain"


class Family(StrictModel):
    part: Annotated[Shared, section_defaults(weight=0.1)] = Shared(weight=0.1)
    optional: Annotated[Shared | None, section_defaults(kind="fancy")] = None


def test_a_key_left_out_takes_the_familys_default_not_the_shared_classs():
    assert Family().part == Shared(weight=0.1)
    assert Family(part={"kind": "other"}).part == Shared(weight=0.1, kind="other")
    assert Family(part={"weight": 0.5}).part.weight == 0.5  # what the config says wins
    assert Family(optional={}).optional == Shared(kind="fancy")
    assert Family(optional=None).optional is None
    assert Shared().weight == 1.0  # the shared class keeps its own default for other families


def test_the_shared_classs_checks_still_apply_and_instances_pass_as_given():
    with pytest.raises(ValidationError, match="part.weight"):
        Family(part={"weight": -1.0})
    assert Family(part=Shared()).part.weight == 1.0  # an instance was built by its caller: taken as it is
