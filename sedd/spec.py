"""``sedd.spec`` is ``sedd.kinds.spec``, where the spec kind and all it knows live; this name stays for callers.

The module object itself is ``sedd.kinds.spec`` (not a copy), so its names, private ones included, and
anything patched on it are the kind module's.
"""

import sys

from sedd.kinds import spec as _kind_module

sys.modules[__name__] = _kind_module
