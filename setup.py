"""The four optional C extensions; everything else about the package is in pyproject.toml.

They are declared here because setuptools' ``[tool.setuptools.ext-modules]`` tables
in pyproject.toml are still experimental (pip install warns about them).
``optional=True``: where no C compiler is found (or a build fails) the install goes
on without the module, and its Python twin serves the same contract.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # The caching allocators' hot path (allocators/_fastpath.py is the Python twin;
        # `streamrt doctor` says when it runs instead).
        Extension("allocators._fastpath_c", ["allocators/_fastpath_c.c"], optional=True),
        # The FMHA backward workspace pack as a native host function
        # (streamrt.recipes.fmha_bwd.native); without it pack="native" is refused.
        Extension("streamrt.recipes.fmha_bwd._pack_c", ["streamrt/recipes/fmha_bwd/_pack_c.c"], optional=True),
        # The native destructor of user objects that tie keepalives to graphs other libraries
        # capture (streamrt._graph_release); without it such a capture is refused (CaptureError).
        Extension("streamrt._graph_release_c", ["streamrt/_graph_release_c.c"], optional=True),
        # A launch's driver calls in one native call (streamrt._backends._native_ops); without it the
        # GPU backends make the same calls one by one through the bindings.
        # Its Submitter (_submit_c.h, included) runs deferred launches' calls on a thread of its own.
        Extension(
            "streamrt._backends._launch_c", ["streamrt/_backends/_launch_c.c"], depends=["streamrt/_backends/_submit_c.h"], optional=True
        ),
    ],
)
