package bench_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/sidecar"
)

func BenchmarkTmpHeap(b *testing.B) {
	ns := testenv.NATS(b)
	b.Setenv("AWS_ACCESS_KEY_ID", "x")
	b.Setenv("AWS_SECRET_ACCESS_KEY", "x")
	b.Setenv("AWS_REGION", "us-east-1")
	cfg := config.Default()
	cfg.NATSURL = ns.ClientURL()
	cfg.DataDir = b.TempDir()
	cfg.DynamoDBEndpoint = "http://127.0.0.1:" + strconv.Itoa(freePort(b))
	cfg.HTTPAddr = "127.0.0.1:" + strconv.Itoa(freePort(b))
	cfg.AdminAddr = "127.0.0.1:" + strconv.Itoa(freePort(b))
	cfg.MemoryLimit, cfg.BufferMemory, cfg.SpillMaxBytes = "none", "none", "0"
	sc := sidecar.New(cfg, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go sc.Run(ctx)
	<-sc.Started()
	pub := testenv.Connect(b, ns.ClientURL())
	one := []byte(`{"count":1}`)
	var maxInuse, maxSys uint64
	var ms runtime.MemStats
	for i := range b.N {
		pub.Publish("mentions.topic-"+strconv.Itoa(i), one)
		if i%10000 == 9999 {
			pub.Flush()
			time.Sleep(50 * time.Millisecond)
			runtime.ReadMemStats(&ms)
			maxInuse = max(maxInuse, ms.HeapInuse)
			maxSys = max(maxSys, ms.HeapSys-ms.HeapReleased)
		}
	}
	pub.Flush()
	time.Sleep(3 * time.Second)
	runtime.ReadMemStats(&ms)
	b.Logf("max heapinuse %d MiB, max heap retained %d MiB, end inuse %d, numgc %d", maxInuse>>20, maxSys>>20, ms.HeapInuse>>20, ms.NumGC)
	runtime.GC()
	f, _ := os.Create("/tmp/heap.prof")
	pprof.WriteHeapProfile(f)
	f.Close()
	runtime.ReadMemStats(&ms)
	b.Logf("after GC: heapinuse %d MiB, alloc %d MiB, mentions %v", ms.HeapInuse>>20, ms.HeapAlloc>>20, testenv.Metric(b, sc.Registry(), "hotcount_ingest_mentions_total"))
}
