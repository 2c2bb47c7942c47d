from netmon.cli import main

raise SystemExit(main())
