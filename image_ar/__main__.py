"""``python -m mmspec.image_ar``: see :mod:`mmspec.image_ar.evaluate`."""

from .evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
