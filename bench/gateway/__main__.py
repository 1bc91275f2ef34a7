import sys

from bench.gateway.main import main

sys.exit(main())
