package testenv_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestDynaliteOutlivesAnAbortedRequest: a client that goes away halfway
// through a request's body (a SIGKILLed sidecar, an SDK timeout) must not
// take dynalite down with it, as plain dynalite 4.0.0 does (CI run of
// 2e8ad18: TestPartitionedClusterLosesNothing lost its store that way).
func TestDynaliteOutlivesAnAbortedRequest(t *testing.T) {
	d := testenv.StartDynalite(t)
	for range 3 {
		c, err := net.Dial("tcp", strings.TrimPrefix(d.Endpoint, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		// Half a body, then a reset: what a killed process leaves.
		if _, err := c.Write([]byte("POST / HTTP/1.1\r\nHost: dynalite\r\nContent-Length: 1000\r\n\r\n{\"Tab")); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).SetLinger(0) //nolint:errcheck // a FIN aborts it too
		c.Close()
	}
	// The aborts reach dynalite at once, but its crash takes a moment:
	// ask until a call has come after the last of them was surely read.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := d.Client().ListTables(ctx, &dynamodb.ListTablesInput{}); err != nil {
			t.Fatalf("call %d after the aborted requests: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
