package globaltable_test

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/hotcount/hotcount/internal/testtools/globaltable"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
)

const table = "hotcount"

func key(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: pk}}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// add is hotcount's counting write: ADD :delta to the item's count.
func add(ctx context.Context, c *dynamodb.Client, pk string, delta int64) error {
	_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       key(pk),
		UpdateExpression:          aws.String("ADD #count :delta"),
		ExpressionAttributeNames:  map[string]string{"#count": schema.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":delta": &types.AttributeValueMemberN{Value: strconv.FormatInt(delta, 10)}},
	})
	return err
}

func put(t *testing.T, c *dynamodb.Client, pk, v string) {
	t.Helper()
	item := key(pk)
	item["v"] = &types.AttributeValueMemberS{Value: v}
	if _, err := c.PutItem(ctx(t), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
		t.Fatalf("PutItem %s: %v", pk, err)
	}
}

// items is the table's content in one Region, by pk.
func items(t *testing.T, c *dynamodb.Client) map[string]map[string]types.AttributeValue {
	t.Helper()
	got := map[string]map[string]types.AttributeValue{}
	p := dynamodb.NewScanPaginator(c, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx(t))
		if err != nil {
			t.Fatalf("Scan: %v", err)
		}
		for _, it := range out.Items {
			got[it[schema.AttrPK].(*types.AttributeValueMemberS).Value] = it
		}
	}
	return got
}

func get(t *testing.T, c *dynamodb.Client, pk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := c.GetItem(ctx(t), &dynamodb.GetItemInput{TableName: aws.String(table), Key: key(pk), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatalf("GetItem %s: %v", pk, err)
	}
	return out.Item
}

func count(t *testing.T, c *dynamodb.Client, pk string) int64 {
	t.Helper()
	return testenv.CountOf(t, get(t, c, pk))
}

// TestReplicatesWithoutConflicts: every kind of write made in one Region
// reaches the other, identical, when no two Regions write the same item.
func TestReplicatesWithoutConflicts(t *testing.T) {
	e := globaltable.Start(t, []string{"us-east-1", "eu-west-1"}, 50*time.Millisecond)
	e.CreateTable(t, table)
	us, eu := e.Client("us-east-1"), e.Client("eu-west-1")

	images := 0 // item writes, each to be applied once in the other Region
	for i := range 5 {
		put(t, us, fmt.Sprintf("put-%d", i), "us")
		images++
	}
	for i := range 5 {
		if err := add(ctx(t), us, fmt.Sprintf("add-%d", i), int64(i+1)); err != nil {
			t.Fatal(err)
		}
		images++
	}
	if _, err := us.DeleteItem(ctx(t), &dynamodb.DeleteItemInput{TableName: aws.String(table), Key: key("put-0")}); err != nil {
		t.Fatal(err)
	}
	images++
	batch := []types.WriteRequest{{DeleteRequest: &types.DeleteRequest{Key: key("put-1")}}}
	for i := range 3 {
		item := key(fmt.Sprintf("batch-%d", i))
		item["v"] = &types.AttributeValueMemberN{Value: strconv.Itoa(i)}
		batch = append(batch, types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
	}
	if _, err := us.BatchWriteItem(ctx(t), &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{table: batch}}); err != nil {
		t.Fatal(err)
	}
	images += len(batch)
	// No TransactWriteItems: dynalite does not implement it
	// (UnknownOperationException); written_test.go checks its parsing.
	// And the other way, on other items.
	put(t, eu, "eu-0", "eu")
	images++

	e.Settled(t, 30*time.Second)
	gotUS, gotEU := items(t, us), items(t, eu)
	if len(gotUS) != 12 { // 5 puts - 2 deleted + 5 adds + 3 batch + eu-0
		t.Errorf("us-east-1 holds %d items, want 12: %v", len(gotUS), gotUS)
	}
	if !reflect.DeepEqual(gotUS, gotEU) {
		t.Errorf("the Regions differ:\nus-east-1 %v\neu-west-1 %v", gotUS, gotEU)
	}
	if n := count(t, eu, "add-4"); n != 5 {
		t.Errorf("eu-west-1 add-4 count = %d, want 5", n)
	}
	if n := e.Conflicts(); n != 0 {
		t.Errorf("Conflicts() = %d, want 0", n)
	}
	if n := e.Replicated(); n != int64(images) {
		t.Errorf("Replicated() = %d, want %d (one per item write)", n, images)
	}
}

// TestConcurrentAddsLoseIncrements is the loss MREC has: two Regions that
// ADD to one item within the replication delay both end with the later
// writer's image, and the other Region's increments are gone, silently.
func TestConcurrentAddsLoseIncrements(t *testing.T) {
	regions := []string{"us-east-1", "eu-west-1"}
	e := globaltable.Start(t, regions, 100*time.Millisecond)
	e.CreateTable(t, table)
	const perRegion, writers = 200, 8

	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range regions {
		c := e.Client(r)
		for range writers {
			wg.Go(func() {
				<-start
				for range perRegion / writers {
					if err := add(ctx(t), c, "hot", 1); err != nil {
						t.Errorf("%s: ADD: %v", r, err)
						return
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	e.Settled(t, 60*time.Second)

	us, eu := count(t, e.Client("us-east-1"), "hot"), count(t, e.Client("eu-west-1"), "hot")
	sent := int64(len(regions) * perRegion)
	t.Logf("%d increments acknowledged, both Regions hold %d / %d: %d lost (%.0f%%); %d conflicts, %d images applied",
		sent, us, eu, sent-us, 100*float64(sent-us)/float64(sent), e.Conflicts(), e.Replicated())
	if us != eu {
		t.Errorf("the Regions disagree after settling: us-east-1 %d, eu-west-1 %d", us, eu)
	}
	if us >= sent {
		t.Errorf("count = %d, want < %d: concurrent ADDs in two Regions must lose some", us, sent)
	}
	if e.Conflicts() == 0 {
		t.Error("Conflicts() = 0, want > 0")
	}
}

// TestCutHoldsReplicationUntilHeal: a cut Region keeps serving its clients,
// its writes stay local and the others' stay away from it until Heal; then
// they arrive, last writer wins settling the item both wrote.
func TestCutHoldsReplicationUntilHeal(t *testing.T) {
	const delay = 20 * time.Millisecond
	e := globaltable.Start(t, []string{"us-east-1", "eu-west-1", "ap-south-1"}, delay)
	e.CreateTable(t, table)
	us, eu, ap := e.Client("us-east-1"), e.Client("eu-west-1"), e.Client("ap-south-1")

	e.Cut("us-east-1")
	put(t, us, "from-us", "us")
	put(t, eu, "from-eu", "eu")
	put(t, us, "both", "us")
	put(t, eu, "both", "eu") // later: it wins
	// Settle ignores the held links: the others settle among themselves.
	e.Settled(t, 30*time.Second)
	time.Sleep(10 * delay) // and nothing held arrives late

	if get(t, eu, "from-us") != nil || get(t, ap, "from-us") != nil {
		t.Error("a write of the cut Region left it")
	}
	if get(t, us, "from-eu") != nil {
		t.Error("a write reached the cut Region")
	}
	if get(t, ap, "from-eu") == nil {
		t.Error("the Regions not cut did not replicate between them")
	}
	if v := get(t, us, "both")["v"].(*types.AttributeValueMemberS).Value; v != "us" {
		t.Errorf("cut us-east-1 holds both=%q, want its own us", v)
	}

	e.Heal("us-east-1")
	e.Settled(t, 30*time.Second)
	for _, c := range []*dynamodb.Client{us, eu, ap} {
		if get(t, c, "from-us") == nil || get(t, c, "from-eu") == nil {
			t.Error("a held write did not arrive after Heal")
		}
		if v := get(t, c, "both")["v"].(*types.AttributeValueMemberS).Value; v != "eu" {
			t.Errorf("both=%q after Heal, want the later writer's eu", v)
		}
	}
	// us-east-1's write of "both" lost, discarded in eu-west-1 and
	// ap-south-1: one conflict.
	if n := e.Conflicts(); n != 1 {
		t.Errorf("Conflicts() = %d, want 1", n)
	}
}
