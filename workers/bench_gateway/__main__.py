import sys

from workers.bench_gateway.main import main

sys.exit(main())
