import sys

from graphfeed.cli.main import main

sys.exit(main())
