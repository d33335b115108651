import pytest
from accelerate.state import AcceleratorState, GradientState, PartialState


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test builds its own Accelerator (mixed precision differs between tests)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
