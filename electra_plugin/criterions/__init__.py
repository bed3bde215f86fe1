from . import electra  # noqa: F401
from . import sentence  # noqa: F401
from . import squad  # noqa: F401
from . import tagging  # noqa: F401
