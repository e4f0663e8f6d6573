"""The shipped experiment configs: one `get_config()` per file, every field commented.

Found by name from any install (`sedd train --config tiny`): they are modules
of this package. `shakespeare_char` is the default and the base of the others.
"""
