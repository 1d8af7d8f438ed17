import sys

from isa_tools.cli import main

sys.exit(main())
