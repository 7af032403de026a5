# Types of the C module built from _pack_c.c (the Python side: native.py).
PACK_ADDRESS: int
ARGS_FIELDS: int
