"""What many test modules share (no test module imports another): loopback servers (`servers`), moto's S3 server
(`s3`), fetch-list builders and result readers (`fetchlists`), Delta table helpers (`tables`), the test config
(`config`), the shared crawl (`crawl`), the dedup tests' small crawl (`dedup_crawl`), the standalone cluster
(`cluster`) and Airflow (`airflow`), and the virtual clock (`clock`)."""
