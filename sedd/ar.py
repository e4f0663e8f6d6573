"""``sedd.ar`` is ``sedd.kinds.ar``, where the ar kind and all it knows live; this name stays for callers.

The module object itself is ``sedd.kinds.ar`` (not a copy), so its names, private ones included, and
anything patched on it are the kind module's.
"""

import sys

from sedd.kinds import ar as _kind_module

sys.modules[__name__] = _kind_module
