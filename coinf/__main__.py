from coinf.cli import main

raise SystemExit(main())
