import sys

from gdrprobe.cli import main

sys.exit(main())
