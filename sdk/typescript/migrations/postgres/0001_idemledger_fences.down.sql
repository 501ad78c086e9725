DROP TABLE IF EXISTS idemledger_fences;
