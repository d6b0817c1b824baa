import sys

from captum_ffb.cli import main

sys.exit(main())
