#!/usr/bin/env python3
"""Generate the synthetic customer-service sample dataset in datasets/customer-service/.

Every conversation is built from hand-written templates by a seeded random generator, so
running this script again writes byte-identical files. Facts about orders, parcels, refunds and
accounts reach the assistant only through tool calls and their results (a fake backend in
scripts/customer_service/tools.py). Nothing here comes from real customers; the company
"Fernhollow Outfitters", its carriers, products, people and addresses are made up.

    python3 scripts/make_customer_service_data.py          # write the JSONL files, tools.json, README blocks
    python3 scripts/make_customer_service_data.py --check  # regenerate in memory, exit 1 on any difference

Only the Python standard library is used; the code is in scripts/customer_service/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from customer_service.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(__doc__))
