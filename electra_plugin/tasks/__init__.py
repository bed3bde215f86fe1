from . import electra_pretraining  # noqa: F401
from . import squad  # noqa: F401
from . import tagging  # noqa: F401
