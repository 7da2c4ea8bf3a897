"""``python -m mmspec ...``: the ``mmspec`` command line, for a checkout without the console script on PATH.

Example:
    $ python -m mmspec --help
"""

import sys

from .cli import main

sys.exit(main())
