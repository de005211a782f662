package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// TableRegions returns the Regions of table's replicas, as DescribeTable
// lists them for a global table (none for a table in one Region, and for
// DynamoDB Local and dynalite, which have no global tables).
func TableRegions(ctx context.Context, client DynamoAPI, table string) ([]string, error) {
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
	if err != nil {
		return nil, classify(fmt.Errorf("store: describe %s: %w", table, err))
	}
	if out.Table == nil {
		return nil, errors.New("store: describe " + table + ": no table in the answer")
	}
	var regions []string
	for _, r := range out.Table.Replicas {
		if r.RegionName != nil {
			regions = append(regions, *r.RegionName)
		}
	}
	return regions, nil
}
