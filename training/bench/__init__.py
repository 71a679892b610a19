"""The benchmarks behind ``seqenc bench ...`` (application code, apart from the model core).

model     TVM-KA vs a flattened BERT: time and peak memory of one inference pass
parse     grouping and parsing accuracy of our log parser vs Drain3 on LogHub
ingest    log-ingest throughput and peak RSS, serial and with parallel workers
accuracy  every training mode next to the count baselines, same splits
score     batch-scoring throughput and peak RSS
data      the labelled datasets the accuracy bench reads (hdfs: real HDFS_1 blocks)
baselines the count-vector baselines (also used by ``seqenc evaluate``)
"""
