import sys

from engine_proc.main import main

sys.exit(main())
