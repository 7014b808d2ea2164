import sys

from speedlight.cli import main

sys.exit(main())
