import sys

from ._selfcheck import main

sys.exit(main())
